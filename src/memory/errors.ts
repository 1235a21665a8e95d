// Errors of the memory layer. Argument problems are the engine's DkiArgumentError (validate.ts).

/** An id that does not name a record of this user: unknown, deleted, or another user's (never told apart). */
export class MemoryNotFoundError extends Error {
  constructor(readonly kind: "memory" | "preference", readonly id: string, readonly userId: string) {
    super(`${kind} ${JSON.stringify(id)} not found for user ${JSON.stringify(userId)}`);
    this.name = "MemoryNotFoundError";
  }
}

/** A data folder that cannot be used: foreign, corrupt, of another schema version or another embedder, or already open. */
export class MemoryStoreError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "MemoryStoreError";
  }
}

/**
 * A store file (the memory store's or a knowledge base's LMDB file) that cannot be opened safely:
 * empty, truncated, damaged or not LMDB. It is left untouched; the message says what to do.
 */
export class StoreFileError extends MemoryStoreError {
  constructor(readonly file: string, what: string, readonly problem: string) {
    super(`the ${what} file ${file} ${problem}; it was left untouched. Restore it from a backup, or move it (and ${file}-lock) away to start an empty ${what}`);
    this.name = "StoreFileError";
  }
}

/** A conversation file that is not what its format says; the message names the path inside the file. */
export class ImportFormatError extends Error {
  constructor(readonly file: string, readonly path: string, detail: string) {
    super(`${file}: ${path}: ${detail}`);
    this.name = "ImportFormatError";
  }
}
