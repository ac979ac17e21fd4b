/** A failed call to the server extension, with the server's message when it sent one. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number | null
  ) {
    super(message);
  }
}
