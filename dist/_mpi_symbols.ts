/**
 * The `Deno.dlopen` symbol tables of an MPI library, one per ABI family, with each C prototype
 * beside its entry.
 *
 * MPI fixes the function signatures but not the handle types: Open MPI's `MPI_Comm`,
 * `MPI_Datatype` and `MPI_Op` are pointers to its predefined global objects (so the handle of
 * `MPI_COMM_WORLD` is the address of `ompi_mpi_comm_world`, which a `{ type: "pointer" }`
 * static yields), while MPICH's are 32-bit integers whose values are fixed in its `mpi.h`.
 * Both tables therefore share one shape with the handle type as a parameter.
 *
 * @module
 */

/** The handle type of an MPI ABI family: a pointer (Open MPI) or an int (MPICH). */
export type HandleType = "pointer" | "i32";

/** A handle value in either ABI: a pointer or an int. */
export type Handle = Deno.PointerValue | number;

function functions<H extends HandleType>(h: H) {
  return {
    // int MPI_Initialized(int *flag);
    MPI_Initialized: { parameters: ["buffer"], result: "i32" },
    // int MPI_Finalized(int *flag);
    MPI_Finalized: { parameters: ["buffer"], result: "i32" },
    // int MPI_Init_thread(int *argc, char ***argv, int required, int *provided);
    MPI_Init_thread: { parameters: ["pointer", "pointer", "i32", "buffer"], result: "i32" },
    // int MPI_Finalize(void);
    MPI_Finalize: { parameters: [], result: "i32" },
    // int MPI_Abort(MPI_Comm comm, int errorcode);
    MPI_Abort: { parameters: [h, "i32"], result: "i32" },
    // int MPI_Comm_rank(MPI_Comm comm, int *rank);
    MPI_Comm_rank: { parameters: [h, "buffer"], result: "i32" },
    // int MPI_Comm_size(MPI_Comm comm, int *size);
    MPI_Comm_size: { parameters: [h, "buffer"], result: "i32" },
    // int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *newcomm);
    MPI_Comm_dup: { parameters: [h, "buffer"], result: "i32" },
    // int MPI_Comm_free(MPI_Comm *comm);
    MPI_Comm_free: { parameters: ["buffer"], result: "i32" },
    // int MPI_Comm_set_errhandler(MPI_Comm comm, MPI_Errhandler errhandler);
    MPI_Comm_set_errhandler: { parameters: [h, h], result: "i32" },
    // int MPI_Error_string(int errorcode, char *string, int *resultlen);
    MPI_Error_string: { parameters: ["i32", "buffer", "buffer"], result: "i32" },
    // int MPI_Get_library_version(char *version, int *resultlen);
    MPI_Get_library_version: { parameters: ["buffer", "buffer"], result: "i32" },
    // int MPI_Allreduce(const void *sendbuf, void *recvbuf, int count, MPI_Datatype datatype,
    //                   MPI_Op op, MPI_Comm comm);
    MPI_Allreduce: { parameters: ["pointer", "pointer", "i32", h, h, h], result: "i32" },
    // int MPI_Bcast(void *buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm);
    MPI_Bcast: { parameters: ["pointer", "i32", h, "i32", h], result: "i32" },
    // int MPI_Allgather(const void *sendbuf, int sendcount, MPI_Datatype sendtype,
    //                   void *recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm);
    MPI_Allgather: {
      parameters: ["pointer", "i32", h, "pointer", "i32", h, h],
      result: "i32",
    },
    // int MPI_Reduce_scatter_block(const void *sendbuf, void *recvbuf, int recvcount,
    //                              MPI_Datatype datatype, MPI_Op op, MPI_Comm comm);
    MPI_Reduce_scatter_block: {
      parameters: ["pointer", "pointer", "i32", h, h, h],
      result: "i32",
    },
    // int MPI_Barrier(MPI_Comm comm);
    MPI_Barrier: { parameters: [h], result: "i32" },
    // The nonblocking forms: the same arguments and an MPI_Request *request at the end.
    MPI_Iallreduce: {
      parameters: ["pointer", "pointer", "i32", h, h, h, "buffer"],
      result: "i32",
    },
    MPI_Ibcast: { parameters: ["pointer", "i32", h, "i32", h, "buffer"], result: "i32" },
    MPI_Iallgather: {
      parameters: ["pointer", "i32", h, "pointer", "i32", h, h, "buffer"],
      result: "i32",
    },
    MPI_Ireduce_scatter_block: {
      parameters: ["pointer", "pointer", "i32", h, h, h, "buffer"],
      result: "i32",
    },
    MPI_Ibarrier: { parameters: [h, "buffer"], result: "i32" },
    // int MPI_Test(MPI_Request *request, int *flag, MPI_Status *status);
    MPI_Test: { parameters: ["buffer", "buffer", "pointer"], result: "i32" },
    // int MPI_Isend(const void *buf, int count, MPI_Datatype datatype, int dest, int tag,
    //               MPI_Comm comm, MPI_Request *request);
    MPI_Isend: { parameters: ["pointer", "i32", h, "i32", "i32", h, "buffer"], result: "i32" },
    // int MPI_Iprobe(int source, int tag, MPI_Comm comm, int *flag, MPI_Status *status);
    MPI_Iprobe: { parameters: ["i32", "i32", h, "buffer", "buffer"], result: "i32" },
    // int MPI_Recv(void *buf, int count, MPI_Datatype datatype, int source, int tag,
    //              MPI_Comm comm, MPI_Status *status);
    MPI_Recv: { parameters: ["pointer", "i32", h, "i32", "i32", h, "pointer"], result: "i32" },
  } as const;
}

/** Open MPI's table: the functions plus the predefined handles as pointer statics. */
export const openMpiSymbols = {
  ...functions("pointer"),
  ompi_mpi_comm_world: { type: "pointer" },
  ompi_mpi_errors_return: { type: "pointer" },
  ompi_mpi_float: { type: "pointer" },
  ompi_mpi_int: { type: "pointer" },
  ompi_mpi_byte: { type: "pointer" },
  ompi_mpi_op_sum: { type: "pointer" },
  ompi_mpi_op_max: { type: "pointer" },
  ompi_mpi_op_min: { type: "pointer" },
} as const satisfies Deno.ForeignLibraryInterface;

/** MPICH's table: the functions with int handles. */
export const mpichSymbols = functions("i32") satisfies Deno.ForeignLibraryInterface;

/** The handles and constants a process group needs, resolved for one ABI family. */
export interface MpiConstants {
  commWorld: Handle;
  errorsReturn: Handle;
  float: Handle;
  int: Handle;
  byte: Handle;
  sum: Handle;
  max: Handle;
  min: Handle;
  /** `MPI_IN_PLACE`: (void*)1 in Open MPI, (void*)-1 in MPICH. */
  inPlace: Deno.PointerValue;
  /** `MPI_STATUS_IGNORE`: (MPI_Status*)0 in Open MPI, (MPI_Status*)1 in MPICH. */
  statusIgnore: Deno.PointerValue;
  /** `MPI_ANY_SOURCE`: -1 in Open MPI, -2 in MPICH. */
  anySource: number;
  /** Bytes of `MPI_Status`, and the int index of its `MPI_SOURCE` field. */
  statusInts: number;
  statusSourceIndex: number;
}

/**
 * MPICH's values, from its `mpi.h` (stable across MPICH 3 and 4, and its derivatives).
 * Made on demand: pointers need the FFI permission, which importing must not.
 *
 * @returns The constants.
 */
export function mpichConstants(): MpiConstants {
  return {
    commWorld: 0x44000000,
    errorsReturn: 0x54000001,
    float: 0x4c00040a,
    int: 0x4c000405,
    byte: 0x4c00010d,
    sum: 0x58000003,
    max: 0x58000001,
    min: 0x58000002,
    inPlace: Deno.UnsafePointer.create(0xffffffffffffffffn),
    statusIgnore: Deno.UnsafePointer.create(1n),
    anySource: -2,
    // struct { int count_lo, count_hi_and_cancelled, MPI_SOURCE, MPI_TAG, MPI_ERROR; }
    statusInts: 5,
    statusSourceIndex: 2,
  };
}

/**
 * Open MPI's values for a library opened with {@linkcode openMpiSymbols}.
 *
 * @param s The opened library's symbols.
 * @returns The constants.
 */
export function openMpiConstants(
  s: Deno.DynamicLibrary<typeof openMpiSymbols>["symbols"],
): MpiConstants {
  return {
    commWorld: s.ompi_mpi_comm_world,
    errorsReturn: s.ompi_mpi_errors_return,
    float: s.ompi_mpi_float,
    int: s.ompi_mpi_int,
    byte: s.ompi_mpi_byte,
    sum: s.ompi_mpi_op_sum,
    max: s.ompi_mpi_op_max,
    min: s.ompi_mpi_op_min,
    inPlace: Deno.UnsafePointer.create(1n),
    statusIgnore: null,
    anySource: -1,
    // struct { int MPI_SOURCE, MPI_TAG, MPI_ERROR, _cancelled; size_t _ucount; }
    statusInts: 6,
    statusSourceIndex: 0,
  };
}
