//! The store's connection: one server (a [`ConnectionManager`]) or a Redis Cluster
//! (redis-rs's cluster connection, which follows `MOVED`/`ASK` and routes each command
//! by its key's slot). Owns parsing the URL forms and walking every primary for `SCAN`;
//! nothing here decides what a command means.
//!
//! Cluster URLs: `redis+cluster://[user:pass@]host:port,host:port,…` (seed nodes; the
//! rest of the topology is discovered), `rediss+cluster://…` for TLS. Every key the store
//! writes carries a hash tag, so a script's keys always share a slot.

use std::path::{Path, PathBuf};
use std::time::Duration;

use idem_core::StoreError;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// A cluster's seed nodes, as single-server URLs, and how to reach any node.
#[derive(Debug, Clone)]
pub(crate) struct ClusterSeeds {
    /// `redis://user:pass@` or `rediss://…@`: a node's URL is this and its address.
    pub base: String,
    pub nodes: Vec<String>,
    pub ca_file: Option<PathBuf>,
}

impl ClusterSeeds {
    /// `Some` for the cluster URL forms; `None` for a single server's URL.
    pub fn parse(url: &str, ca_file: Option<&Path>) -> Result<Option<Self>, StoreError> {
        let (tls, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
            (false, rest)
        } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
            (true, rest)
        } else {
            return Ok(None);
        };
        let (auth, hosts) = match rest.rsplit_once('@') {
            Some((auth, hosts)) => (format!("{auth}@"), hosts),
            None => (String::new(), rest),
        };
        let hosts = hosts.trim_end_matches('/');
        if hosts.contains('/') || hosts.contains('?') {
            return Err(StoreError::InvalidInput(
                "a Redis Cluster URL names seed nodes only (no database, no query)".into(),
            ));
        }
        let scheme = if tls { "rediss" } else { "redis" };
        let base = format!("{scheme}://{auth}");
        let nodes: Vec<String> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("{base}{h}"))
            .collect();
        if nodes.is_empty() {
            return Err(StoreError::InvalidInput(
                "a Redis Cluster URL needs at least one host:port".into(),
            ));
        }
        if ca_file.is_some() && !tls {
            return Err(StoreError::InvalidInput(
                "a Redis CA file needs a rediss+cluster:// URL".into(),
            ));
        }
        Ok(Some(Self {
            base,
            nodes,
            ca_file: ca_file.map(Path::to_path_buf),
        }))
    }

    pub async fn connect(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<ClusterConnection, RedisError> {
        let mut builder = redis::cluster::ClusterClientBuilder::new(self.nodes.clone())
            .connection_timeout(connect_timeout)
            .response_timeout(response_timeout)
            .retries(3);
        if let Some(ca) = &self.ca_file {
            let root = std::fs::read(ca)?;
            builder = builder.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root),
            });
        }
        builder.build()?.get_async_connection().await
    }

    /// A plain connection to one node (`host:port`), for what a cluster connection does
    /// not route to a single server (`INFO`, a primary's `SCAN`).
    pub async fn node(&self, addr: &str) -> Result<redis::aio::MultiplexedConnection, StoreError> {
        let client = open_client(&format!("{}{addr}", self.base), self.ca_file.as_deref())?;
        client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| crate::reply::map_err(&e))
    }

    /// A plain connection to the first seed.
    pub async fn first_seed(&self) -> Result<redis::aio::MultiplexedConnection, StoreError> {
        let seed = self.nodes[0]
            .strip_prefix(&self.base)
            .unwrap_or(&self.nodes[0]);
        self.node(seed).await
    }

    /// `host:port` of every primary, from `CLUSTER NODES` of a seed.
    pub async fn primaries(&self) -> Result<Vec<String>, StoreError> {
        let mut conn = self.first_seed().await?;
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await
            .map_err(|e| crate::reply::map_err(&e))?;
        Ok(parse_primaries(&nodes))
    }
}

/// The address of each connected primary in a `CLUSTER NODES` reply (`id ip:port@bus
/// flags …`).
fn parse_primaries(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _id = fields.next()?;
            let addr = fields.next()?;
            let flags = fields.next()?;
            let primary = flags.split(',').any(|f| f == "master")
                && !flags.split(',').any(|f| f == "fail" || f == "noaddr");
            primary.then(|| addr.split('@').next().unwrap_or(addr).to_string())
        })
        .collect()
}

/// Every key matching `pattern` on `conn` (one server), in `SCAN` steps.
pub async fn scan<C: ConnectionLike + Send>(
    conn: &mut C,
    pattern: &str,
) -> Result<Vec<String>, RedisError> {
    let mut cursor: u64 = 0;
    let mut all = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        all.extend(keys);
        if next == 0 {
            return Ok(all);
        }
        cursor = next;
    }
}

/// A client for `url`; a `rediss://` one trusts `ca_file` (PEM) instead of the system's
/// roots when given.
pub fn open_client(
    url: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<redis::Client, StoreError> {
    let bad = |e: RedisError| StoreError::InvalidInput(format!("redis url: {e}"));
    match ca_file {
        None => redis::Client::open(url).map_err(bad),
        Some(path) => {
            let root = std::fs::read(path).map_err(|e| {
                StoreError::InvalidInput(format!(
                    "reading the Redis CA file {}: {e}",
                    path.display()
                ))
            })?;
            if !url.starts_with("rediss://") {
                return Err(StoreError::InvalidInput(
                    "a Redis CA file needs a rediss:// URL".into(),
                ));
            }
            redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root),
                },
            )
            .map_err(bad)
        }
    }
}

/// A client for publish/subscribe beside a store on `url`: the server itself, or a
/// cluster's first seed (a cluster broadcasts `PUBLISH` to every node).
pub fn pubsub_client(
    url: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<redis::Client, StoreError> {
    match ClusterSeeds::parse(url, ca_file)? {
        Some(seeds) => open_client(&seeds.nodes[0], ca_file),
        None => open_client(url, ca_file),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls() {
        let s = ClusterSeeds::parse("redis+cluster://u:p@a:1,b:2/", None)
            .unwrap()
            .unwrap();
        assert_eq!(s.nodes, ["redis://u:p@a:1", "redis://u:p@b:2"]);
        assert!(ClusterSeeds::parse("redis://a:1", None).unwrap().is_none());
        assert!(ClusterSeeds::parse("redis+cluster://", None).is_err());
        assert!(ClusterSeeds::parse("redis+cluster://a:1/0", None).is_err());
        assert!(ClusterSeeds::parse("redis+cluster://a:1", Some(Path::new("ca.pem"))).is_err());
        let tls = ClusterSeeds::parse("rediss+cluster://a:1", Some(Path::new("ca.pem")))
            .unwrap()
            .unwrap();
        assert_eq!(tls.nodes, ["rediss://a:1"]);
    }

    #[test]
    fn primaries_from_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7002@17002 master - 0 0 2 connected 5461-10922
c3 127.0.0.1:7003@17003 slave b2 0 0 2 connected
d4 127.0.0.1:7004@17004 master,fail - 0 0 3 connected
";
        assert_eq!(parse_primaries(nodes), ["127.0.0.1:7001", "127.0.0.1:7002"]);
    }
}
