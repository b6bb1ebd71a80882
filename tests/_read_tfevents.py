#!/usr/bin/env python3
"""Reads TensorBoard event files with nothing but the standard library and prints them as JSON.

An independent reader of the tfevents record format, for the tests of train/tfevents.ts:
every record's two checksums are verified (CRC32C computed from a table built here) and the
Event / Summary protocol buffers are parsed field by field.

Usage: _read_tfevents.py FILE...   -> [{"file": ..., "events": [{...}, ...]}, ...]
Exits 1 with a message naming the file and offset on a bad checksum or a truncated record.
"""

import json
import struct
import sys


def _table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = _table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = 0
    value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def fields(buf):
    """Yields (field number, wire type, value) of a protocol buffer message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(buf, i)
        elif wire == 1:
            value = buf[i:i + 8]
            i += 8
        elif wire == 2:
            n, i = varint(buf, i)
            value = buf[i:i + n]
            i += n
        elif wire == 5:
            value = buf[i:i + 4]
            i += 4
        else:
            raise ValueError("unsupported wire type %d" % wire)
        if i > len(buf):
            raise ValueError("truncated field %d" % number)
        yield number, wire, value


def event(buf):
    out = {}
    for number, wire, value in fields(buf):
        if number == 1 and wire == 1:
            out["wall_time"] = struct.unpack("<d", value)[0]
        elif number == 2 and wire == 0:
            out["step"] = value
        elif number == 3 and wire == 2:
            out["file_version"] = value.decode("utf-8")
        elif number == 5 and wire == 2:
            values = []
            for n, w, v in fields(value):
                if n != 1 or w != 2:
                    continue
                item = {}
                for n2, w2, v2 in fields(v):
                    if n2 == 1 and w2 == 2:
                        item["tag"] = v2.decode("utf-8")
                    elif n2 == 2 and w2 == 5:
                        x = struct.unpack("<f", v2)[0]
                        item["simple_value"] = x if x == x else "NaN"
                values.append(item)
            out["summary"] = values
        else:
            out.setdefault("other_fields", []).append(number)
    return out


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    events = []
    off = 0
    while off < len(data):
        if off + 12 > len(data):
            sys.exit("%s: truncated record header at offset %d" % (path, off))
        header = data[off:off + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[off + 8:off + 12])
        if masked(header) != length_crc:
            sys.exit("%s: bad length checksum at offset %d" % (path, off))
        body = data[off + 12:off + 12 + length]
        if len(body) != length or off + 16 + length > len(data):
            sys.exit("%s: truncated record at offset %d" % (path, off))
        (body_crc,) = struct.unpack("<I", data[off + 12 + length:off + 16 + length])
        if masked(body) != body_crc:
            sys.exit("%s: bad data checksum at offset %d" % (path, off))
        events.append(event(body))
        off += 16 + length
    return events


if __name__ == "__main__":
    print(json.dumps([{"file": p, "events": read(p)} for p in sys.argv[1:]]))
