//! Creates (or brings up to date) a store schema with its SQL functions: what a service
//! in another language needs before it calls them, as `idem migrate` does for idem's
//! own services. `idem-example-python-orders-migrate URL SCHEMA`.

use idem_postgres::{PgOptions, PgStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(schema)) = (args.next(), args.next()) else {
        return Err("usage: idem-example-python-orders-migrate URL SCHEMA".into());
    };
    let mut options = PgOptions::default();
    options.schema = Some(schema.clone());
    options.max_connections = 1;
    let store = PgStore::connect(&url, options).await?;
    let applied = store.migrate().await?;
    println!("schema {schema}: applied migrations {applied:?}");
    Ok(())
}
