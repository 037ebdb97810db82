//! `crest sim`: a topology and a workload under virtual time.

use crate::*;

pub(crate) fn sim(
    topology: Option<&Path>,
    workload_path: &Path,
    seeds: std::ops::Range<u64>,
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
    if seeds.end - seeds.start > 1 {
        if json.is_some() {
            bail!("--json writes one run's report: give one seed");
        }
        return swarm(&topology, &workload, seeds);
    }
    let seed = seeds.start;
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

/// Runs every seed of `seeds`, one line each; fails naming the seeds that broke an invariant.
fn swarm(
    topology: &crest::core::topology::Topology,
    workload: &crest::sim::Workload,
    seeds: std::ops::Range<u64>,
) -> Result<()> {
    let count = seeds.end - seeds.start;
    let mut failed = Vec::new();
    for seed in seeds {
        let report = crest::sim::run(topology, workload, seed)?;
        let violations = report.violations();
        println!(
            "seed {seed}: pushed {} delivered {} duplicates {} crashes {} partitions {} \
             disk failures {} torn records {}: {}",
            report.pushed,
            report.delivered,
            report.duplicates,
            report.crashes,
            report.partitions,
            report.disk_failures,
            report.torn_records,
            if violations.is_empty() {
                "ok".to_string()
            } else {
                violations.join("; ")
            }
        );
        if !violations.is_empty() {
            failed.push(seed);
        }
    }
    if !failed.is_empty() {
        let list: Vec<String> = failed.iter().map(u64::to_string).collect();
        bail!(
            "{} of {count} seeds broke an invariant: {}; reproduce one with --seed and the same files",
            failed.len(),
            list.join(", ")
        );
    }
    println!("{count} seeds: every invariant held");
    Ok(())
}
