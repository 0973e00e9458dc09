//! `idem completions SHELL`: the shell completion script of the whole command line.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    shell: clap_complete::Shell,
}

/// `cli` is the whole command line, handed in by `main` (which owns it).
pub fn run(args: CompletionsArgs, mut cli: clap::Command) -> ExitCode {
    clap_complete::generate(args.shell, &mut cli, "idem", &mut std::io::stdout());
    ExitCode::SUCCESS
}
