//! Runs the 20:14 incident demo on a temporary embedded store and prints both outcomes
//! (`--json` for the report as JSON). The CLI's `idem demo incident` does the same.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let json = std::env::args().any(|a| a == "--json");
    let report = idem_bench::demo::demo_incident(idem_bench::demo::DemoOptions::default()).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render_text());
    }
    Ok(())
}
