//! The command's standard input: what `run` and `lease exec` give it, as
//! `docker run -i` or `ssh host cmd < file` would.
//!
//! When this process's stdin is not a terminal (a pipe or a file), or with
//! `--stdin -`, it is read to its end before any sandbox is created and
//! given to the command; `--stdin FILE` reads a file instead, and
//! `--no-stdin` gives the command an empty input. The input is buffered
//! (providers stage it as one file), so it is limited to [`MAX_STDIN`].
//! With `-i` or `-t` nothing is read here: stdin is passed on while the
//! command runs (`crate::interactive`).

use std::io::{IsTerminal, Read};

use anyhow::{bail, Context, Result};

use crate::RunArgs;

/// The largest input given to a command: the bytes travel into the
/// provider component's memory (256 MiB) and are staged as one upload.
pub const MAX_STDIN: u64 = 32 * 1024 * 1024;

/// The command's input for `args`: `None` when it gets an empty one.
pub fn read(args: &RunArgs) -> Result<Option<Vec<u8>>> {
    if args.no_stdin || args.interactive || args.tty {
        return Ok(None);
    }
    let (what, source): (String, Box<dyn Read>) = match &args.stdin_file {
        Some(path) if path.as_os_str() != "-" => (
            path.display().to_string(),
            Box::new(
                std::fs::File::open(path)
                    .with_context(|| format!("opening --stdin {}", path.display()))?,
            ),
        ),
        Some(_) => ("standard input".to_owned(), Box::new(std::io::stdin())),
        None if !std::io::stdin().is_terminal() => {
            ("standard input".to_owned(), Box::new(std::io::stdin()))
        }
        None => return Ok(None),
    };
    let mut bytes = Vec::new();
    source
        .take(MAX_STDIN + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading the command's input from {what}"))?;
    if bytes.len() as u64 > MAX_STDIN {
        let mib = MAX_STDIN / (1024 * 1024);
        bail!(
            "the command's input ({what}) is larger than {mib} MiB, the most `sandbox` gives a \
             command; nothing was run. To move more data, hold a lease and append it in \
             pieces: `split -b {mib}M FILE piece.`, then for each piece `sandbox lease exec \
             LEASE --stdin PIECE -- sh -c 'cat >> FILE'` (or pass --no-stdin to give the \
             command no input)"
        );
    }
    // The contract's "none" is an empty input: no staging request for it.
    Ok((!bytes.is_empty()).then_some(bytes))
}
