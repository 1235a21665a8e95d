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

/** A conversation file that is not what its format says; the message names the path inside the file. */
export class ImportFormatError extends Error {
  constructor(readonly file: string, readonly path: string, detail: string) {
    super(`${file}: ${path}: ${detail}`);
    this.name = "ImportFormatError";
  }
}
