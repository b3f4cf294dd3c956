//! The exit codes of every subcommand, named once: `main` exits with them, and the manual's
//! EXIT STATUS lists [`CODES`] (the README's table says the same, checked by a test).

/// The workspace is invalid: syntax, contract, or an evaluation that failed or hit a limit.
pub const INVALID: u8 = 1;
/// A file cannot be read or written, the agent cannot be reached, the command line is wrong
/// (clap exits 2 itself), or `run` stopped on a failure.
pub const IO: u8 = 2;
/// `status` (and `top --once`): the agent answers, and is not ready.
pub const NOT_READY: u8 = 1;
/// `status`: something took the connection and did not answer within `--timeout`.
pub const NO_ANSWER: u8 = 3;

/// Each code and what it means.
pub const CODES: &[(u8, &str)] = &[
    (
        0,
        "Success; for status and top --once, the agent answered and is ready.",
    ),
    (
        INVALID,
        "The workspace is invalid: syntax, contract, an evaluation error, or an evaluation limit \
         hit; for status and top --once, the agent answered and is not ready; for import, \
         something was left out (the workspace is written all the same).",
    ),
    (
        IO,
        "A file cannot be read or written, the command line is wrong, status or top could not \
         reach the agent (nothing listens at the address), or run stopped on a failure: one of \
         its tasks ended or panicked (the log names it).",
    ),
    (
        NO_ANSWER,
        "status, top: the address took the connection and nothing answered within --timeout (5 \
         s by default).",
    ),
];
