/**
 * Drops Node's DEP0040 warning ("The `punycode` module is deprecated"), which Vega's URL
 * handling triggers on import and which says nothing about the charts. Imported before
 * Vega (module bodies run in import order); every other warning still prints. Private to train/.
 *
 * @module
 */

import process from "node:process";

const emit = process.emitWarning.bind(process);
process.emitWarning = ((warning: string | Error, ...rest: unknown[]) => {
  const code = typeof rest[0] === "object" && rest[0] !== null
    ? (rest[0] as { code?: string }).code
    : rest[1];
  if (code === "DEP0040") return;
  return (emit as (...a: unknown[]) => void)(warning, ...rest);
}) as typeof process.emitWarning;
