//! `crest token`: the principals, grants and API tokens of an access file.

use crate::*;
use crest::core::access::Grants;
use crest::node::access::AccessFile;

#[derive(Subcommand)]
pub(crate) enum TokenCommand {
    /// Create a token for a principal (created too if new, with the grants given) and print
    /// it: the only time it is shown; the file keeps its hash.
    Create {
        /// The principal.
        name: String,
        #[command(flatten)]
        file: AccessArgs,
        /// Permissions to add, `NAMESPACE:PERM[,PERM...]` with PERM produce, consume or
        /// admin, NAMESPACE `*` for all (repeatable).
        #[arg(long, value_parser = Grants::parse_one)]
        grant: Vec<(String, Vec<crest::core::access::Permission>)>,
    },
    /// List the tokens (id, principal, created) and the principals' grants.
    List {
        #[command(flatten)]
        file: AccessArgs,
    },
    /// Revoke a token by its id: nodes refuse it, and close connections that used it, once
    /// they re-read the file (SIGHUP).
    Revoke {
        /// The token's id (as `crest token list` shows it, or the part after `crest_`).
        id: String,
        #[command(flatten)]
        file: AccessArgs,
    },
    /// Add permissions to a principal (created if new) without making a token: for
    /// principals that prove themselves with a client certificate.
    Grant {
        /// The principal.
        name: String,
        #[command(flatten)]
        file: AccessArgs,
        /// As for `create`.
        #[arg(long, value_parser = Grants::parse_one, required = true)]
        grant: Vec<(String, Vec<crest::core::access::Permission>)>,
    },
}

#[derive(Args)]
pub(crate) struct AccessArgs {
    /// The access file (created if missing).
    #[arg(long, env = "CREST_ACCESS")]
    access: PathBuf,
}

impl AccessArgs {
    fn load(&self) -> Result<AccessFile> {
        if self.access.exists() {
            Ok(AccessFile::load(&self.access)?)
        } else {
            Ok(AccessFile::new())
        }
    }

    fn save(&self, file: &AccessFile) -> Result<()> {
        Ok(file.save(&self.access)?)
    }
}

fn grants_of(list: Vec<(String, Vec<crest::core::access::Permission>)>) -> Grants {
    let mut grants = Grants::default();
    for (namespace, permissions) in list {
        grants.add(&namespace, &permissions);
    }
    grants
}

fn describe(grants: &Grants) -> String {
    let parts: Vec<String> = grants
        .0
        .iter()
        .map(|(namespace, permissions)| {
            let names: Vec<&str> = permissions.iter().map(|p| p.name()).collect();
            format!("{namespace}:{}", names.join(","))
        })
        .collect();
    if parts.is_empty() {
        "(no grants)".into()
    } else {
        parts.join(" ")
    }
}

pub(crate) fn token(command: TokenCommand) -> Result<()> {
    match command {
        TokenCommand::Create { name, file, grant } => {
            let mut access = file.load()?;
            access
                .grant(&name, &grants_of(grant))
                .map_err(anyhow::Error::msg)?;
            let token = access
                .create_token(&name, crest::node::unix_seconds())
                .map_err(anyhow::Error::msg)?;
            file.save(&access)?;
            eprintln!(
                "token for {name:?} ({}) added to {}; it is shown only now. Nodes accept it once they re-read the file (SIGHUP).",
                describe(&access.principals[&name].grants),
                file.access.display()
            );
            println!("{token}");
        }
        TokenCommand::List { file } => {
            let access = AccessFile::load(&file.access)?;
            println!("{:<18} {:<20} CREATED", "ID", "PRINCIPAL");
            for token in &access.tokens {
                let created = std::time::UNIX_EPOCH + Duration::from_secs(token.created);
                println!(
                    "{:<18} {:<20} {}",
                    token.id,
                    token.principal,
                    humantime::format_rfc3339_seconds(created)
                );
            }
            println!();
            println!("{:<20} GRANTS", "PRINCIPAL");
            for (name, entry) in &access.principals {
                println!("{name:<20} {}", describe(&entry.grants));
            }
        }
        TokenCommand::Revoke { id, file } => {
            let mut access = AccessFile::load(&file.access)?;
            let id = id
                .strip_prefix(crest::node::access::TOKEN_PREFIX)
                .map_or(id.as_str(), |rest| rest.split('_').next().unwrap_or(rest));
            if !access.revoke(id) {
                bail!("no token {id} in {}", file.access.display());
            }
            file.save(&access)?;
            eprintln!(
                "token {id} revoked in {}; send SIGHUP to the nodes to apply it",
                file.access.display()
            );
        }
        TokenCommand::Grant { name, file, grant } => {
            let mut access = file.load()?;
            access
                .grant(&name, &grants_of(grant))
                .map_err(anyhow::Error::msg)?;
            file.save(&access)?;
            eprintln!(
                "{name:?} now holds {}",
                describe(&access.principals[&name].grants)
            );
        }
    }
    Ok(())
}
