//! `private-ingress completions SHELL` and `private-ingress man`: a shell's completion script and
//! the manual page, both generated from the parser's own definition ([`super::Cli`]), so that
//! neither can drift from the flags the binary takes.
//!
//! The manual is one page: the command, then a section per subcommand with its synopsis,
//! description and flags, then the exit status and the environment. One page is one file to
//! install and one `man private-ingress` to read.

use std::io::Write;

use clap::CommandFactory;
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;

use super::Cli;

/// The binary's name, as completions and the manual call it.
const NAME: &str = "private-ingress";

/// Writes `shell`'s completion script for `private-ingress` to `out`.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn Write) {
    clap_complete::generate(shell, &mut without_hidden(Cli::command()), NAME, out);
}

/// `command` without its hidden subcommands, which clap_complete would offer.
fn without_hidden(command: clap::Command) -> clap::Command {
    let mut visible = clap::Command::new(NAME)
        .version(env!("CARGO_PKG_VERSION"))
        .args(command.get_arguments().cloned())
        .subcommands(
            command
                .get_subcommands()
                .filter(|sub| !sub.is_hide_set())
                .cloned(),
        );
    if let Some(about) = command.get_about() {
        visible = visible.about(about.clone());
    }
    visible
}

/// Writes the manual page, in roff, to `out`.
pub fn man(out: &mut dyn Write) -> std::io::Result<()> {
    let mut command = Cli::command().disable_help_subcommand(true);
    command.build();
    let page = Man::new(command.clone()).title(NAME.to_uppercase());
    page.render_title(out)?;
    page.render_name_section(out)?;
    page.render_synopsis_section(out)?;
    page.render_description_section(out)?;
    let subcommands: Vec<_> = command
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .collect();
    let mut list = Roff::new();
    list.control("SH", ["COMMANDS"]);
    for sub in &subcommands {
        list.control("TP", []);
        list.text([bold(sub.get_name())]);
        list.text([roman(
            sub.get_about().map(|a| a.to_string()).unwrap_or_default(),
        )]);
    }
    list.to_writer(out)?;
    for sub in subcommands {
        let mut heading = Roff::new();
        heading.control(
            "SH",
            [format!("{NAME} {}", sub.get_name()).to_uppercase().as_str()],
        );
        heading.to_writer(out)?;
        let page = Man::new(sub.clone());
        // Each part renders under a `.SH` of its own; here they are parts of the subcommand's
        // section.
        for (part, title) in [
            (section(|w| page.render_synopsis_section(w))?, "Synopsis"),
            (
                section(|w| page.render_description_section(w))?,
                "Description",
            ),
            (section(|w| page.render_options_section(w))?, "Options"),
        ] {
            // What follows the part's own `.SH` line.
            let body: Vec<&str> = part
                .lines()
                .skip_while(|line| !line.starts_with(".SH "))
                .skip(1)
                .collect();
            if body.iter().all(|line| line.trim().is_empty()) {
                continue;
            }
            writeln!(out, ".SS {title}")?;
            for line in body {
                writeln!(out, "{line}")?;
            }
        }
    }
    ending().to_writer(out)?;
    page.render_version_section(out)
}

/// What `render` writes, as text.
fn section(render: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> std::io::Result<String> {
    let mut out = Vec::new();
    render(&mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// EXIT STATUS and ENVIRONMENT, which the parser does not know.
fn ending() -> Roff {
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for (code, meaning) in super::exit::CODES {
        roff.control("TP", []);
        roff.text([bold(code.to_string())]);
        roff.text([roman(*meaning)]);
    }
    roff.control("SH", ["ENVIRONMENT"]);
    roff.control("TP", []);
    roff.text([bold("NO_COLOR")]);
    roff.text([roman(
        "Set and not empty: no colour in help, usage errors or logs, on a terminal too. \
         Without it, colour only on a terminal.",
    )]);
    roff.control("TP", []);
    roff.text([bold("RUST_LOG")]);
    roff.text([roman("The log level of run (info by default).")]);
    roff.control("TP", []);
    roff.text([bold("PRIVATE_INGRESS_*")]);
    roff.text([roman(
        "Each flag's variable, named under the flag; the flag wins.",
    )]);
    roff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_offer_only_the_visible_subcommands() {
        let visible = without_hidden(Cli::command());
        let names: Vec<&str> = visible.get_subcommands().map(|s| s.get_name()).collect();
        assert!(
            names.contains(&"check") && names.contains(&"man"),
            "{names:?}"
        );
        assert!(!names.iter().any(|n| n.starts_with("__")), "{names:?}");
        visible.debug_assert();
    }

    #[test]
    fn the_manual_has_a_section_per_subcommand_and_no_hidden_one() {
        let mut out = Vec::new();
        man(&mut out).unwrap();
        let page = String::from_utf8(out).unwrap();
        for heading in [
            ".SH \"PRIVATE-INGRESS CHECK\"",
            ".SH \"PRIVATE-INGRESS RUN\"",
            ".SH COMMANDS",
            ".SH \"EXIT STATUS\"",
        ] {
            assert!(page.contains(heading), "no {heading} in\n{page}");
        }
        assert!(!page.contains("__evaluate-workspace"), "{page}");
        assert_eq!(page.matches(".TH ").count(), 1, "{page}");
        assert_eq!(page.matches(".SH SYNOPSIS").count(), 1, "{page}");
    }
}
