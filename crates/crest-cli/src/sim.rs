//! `crest sim`: a topology and a workload under virtual time.

use crate::*;

pub(crate) fn sim(
    topology: Option<&Path>,
    workload_path: &Path,
    seed: u64,
    json: Option<&Path>,
    set: &[String],
) -> Result<()> {
    let mut topology = load_topology(topology)?;
    for assignment in set {
        topology
            .set_setting(assignment)
            .with_context(|| format!("--set {assignment}"))?;
    }
    let text = std::fs::read_to_string(workload_path)
        .with_context(|| format!("reading {}", workload_path.display()))?;
    let workload = crest::sim::Workload::parse(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", workload_path.display()))?;
    let report = crest::sim::run(&topology, &workload, seed)?;
    print!("{}", report.text());
    write_json(json, &report)?;
    let violations = report.violations();
    if !violations.is_empty() {
        bail!(
            "invariants violated: {}; reproduce with --seed {seed} and the same files",
            violations.join("; ")
        );
    }
    Ok(())
}
