//! Where `idem serve` and `idem gateway` take their settings from. Precedence, highest
//! first: a flag on the command line, its `IDEM_*` environment variable, the config file
//! (`--config FILE` or `IDEM_CONFIG`), the default.
//!
//! Every flag of the two servers has an environment variable: the one it names in
//! `--help`, else `IDEM_` and the flag in upper snake case (`--sweep-every` →
//! `IDEM_SWEEP_EVERY`). `idem serve`'s file is TOML whose keys are its flags
//! (`sweep-every = "1m"` or `sweep_every`; lists for repeatable flags, `true` for
//! switches). The gateway's file is its own configuration (TOML, or JSON); each of its
//! top-level settings also comes from `IDEM_` and the field in upper case
//! (`GatewayConfig::with_env`), and its flags override both. Secrets belong in files (`--api-keys-file`,
//! `--admin-token-file`), never in a file of settings that others may read.
//!
//! Owns this layering only; what each setting means stays with its command.

use std::ffi::OsString;
use std::path::Path;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};

/// The servers' subcommands, whose flags all get an environment variable.
const SERVERS: [&str; 2] = ["serve", "gateway"];

/// Flags that keep their own environment handling (`IDEM_API_KEYS` is a
/// comma-separated list read by the command itself).
const OWN_ENV: [&str; 4] = ["help", "version", "api_keys", "config"];

/// `cmd` with an `IDEM_*` variable on every server flag that has none.
pub fn with_env(cmd: Command) -> Command {
    let mut cmd = cmd;
    for name in SERVERS {
        cmd = cmd.mut_subcommand(name, |sub| {
            let ids: Vec<String> = sub
                .get_arguments()
                .filter(|a| a.get_env().is_none() && !a.is_positional())
                .map(|a| a.get_id().to_string())
                .filter(|id| !OWN_ENV.contains(&id.as_str()))
                .collect();
            ids.into_iter().fold(sub, |sub, id| {
                let var = format!("IDEM_{}", id.to_ascii_uppercase());
                // Values stay out of `--help`: a URL there may carry a password.
                sub.mut_arg(id, |a| a.env(var).hide_env_values(true))
            })
        });
    }
    cmd
}

/// Parses `args`, with `idem serve`'s config file applied: each setting of the file
/// becomes its flag unless the command line or the environment already set it. What the
/// file completes (a flag another requires) is checked only once it is applied; help,
/// version and every other parse error exit as clap makes them.
pub fn parse(cmd: &Command, args: Vec<OsString>) -> Result<ArgMatches, String> {
    let first = cmd.clone().try_get_matches_from(args.clone());
    let matches = match first {
        Ok(m) => m,
        Err(e) => {
            use clap::error::ErrorKind as K;
            let shown = matches!(
                e.kind(),
                K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand
            );
            let lenient = cmd
                .clone()
                .ignore_errors(true)
                .try_get_matches_from(args.clone());
            match lenient {
                Ok(m) if !shown && config_path(&m).is_some() => m,
                _ => e.exit(),
            }
        }
    };
    apply_config_file(cmd, matches, args)
}

fn config_path(matches: &ArgMatches) -> Option<&std::path::PathBuf> {
    match matches.subcommand() {
        Some(("serve", serve)) => serve.get_one::<std::path::PathBuf>("config"),
        _ => None,
    }
}

fn apply_config_file(
    cmd: &Command,
    matches: ArgMatches,
    args: Vec<OsString>,
) -> Result<ArgMatches, String> {
    let Some(path) = config_path(&matches) else {
        return Ok(matches);
    };
    let Some(("serve", serve)) = matches.subcommand() else {
        return Ok(matches);
    };
    let extra = file_args(cmd, &matches, serve, path)?;
    let mut args = args;
    args.extend(extra);
    cmd.clone()
        .try_get_matches_from(args)
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn file_args(
    cmd: &Command,
    root: &ArgMatches,
    serve: &ArgMatches,
    path: &Path,
) -> Result<Vec<OsString>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let sub = cmd
        .find_subcommand("serve")
        .ok_or_else(|| "no serve command".to_string())?;
    let mut out = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let named = |a: &&clap::Arg| a.get_long() == Some(long.as_str());
        let (arg, given) = match sub.get_arguments().find(named) {
            Some(a) => (a, serve.value_source(a.get_id().as_str())),
            None => match cmd.get_arguments().find(named) {
                Some(a) if a.is_global_set() => (a, root.value_source(a.get_id().as_str())),
                _ => {
                    return Err(format!(
                        "{}: unknown setting {key:?} (the keys are idem serve's flags)",
                        path.display()
                    ))
                }
            },
        };
        if long == "config" {
            return Err(format!(
                "{}: a config file cannot name another",
                path.display()
            ));
        }
        if matches!(
            given,
            Some(ValueSource::CommandLine) | Some(ValueSource::EnvVariable)
        ) {
            continue;
        }
        let flag = format!(
            "--{}",
            arg.get_long()
                .ok_or_else(|| format!("{key:?} has no flag"))?
        );
        let values = match value {
            toml::Value::Array(items) => items.iter().collect::<Vec<_>>(),
            one => vec![one],
        };
        for v in values {
            match v {
                toml::Value::Boolean(true) => out.push(flag.clone().into()),
                toml::Value::Boolean(false) => {}
                // `--flag=value`: a value starting with `-` stays a value.
                toml::Value::String(s) => out.push(format!("{flag}={s}").into()),
                toml::Value::Integer(i) => out.push(format!("{flag}={i}").into()),
                toml::Value::Float(f) => out.push(format!("{flag}={f}").into()),
                other => {
                    return Err(format!(
                        "{}: {key}: expected a string, number, boolean or list, got {}",
                        path.display(),
                        other.type_str()
                    ))
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_file_completes_what_a_flag_requires_and_values_stay_values() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("serve.toml");
        std::fs::write(
            &file,
            "tls-key = \"/etc/idem/key.pem\"\n\
             tls-cert = \"/from/the/file.pem\"\n\
             nats-url = \"nats://127.0.0.1:4222\"\n\
             nats_stream = \"-odd-but-a-value\"\n",
        )
        .unwrap();
        let cmd = with_env(crate::Cli::command());
        let path = file.to_str().unwrap();
        // --tls-cert requires --tls-key, which only the file gives.
        let m = parse(
            &cmd,
            args(&["idem", "serve", "--config", path, "--tls-cert", "/flag.pem"]),
        )
        .unwrap();
        let (_, serve) = m.subcommand().unwrap();
        let get = |id: &str| serve.get_one::<std::path::PathBuf>(id).cloned();
        assert_eq!(
            get("tls_cert").unwrap(),
            Path::new("/flag.pem"),
            "the flag wins"
        );
        assert_eq!(get("tls_key").unwrap(), Path::new("/etc/idem/key.pem"));
        assert_eq!(
            serve.get_one::<String>("nats_stream").map(String::as_str),
            Some("-odd-but-a-value")
        );
    }
}
