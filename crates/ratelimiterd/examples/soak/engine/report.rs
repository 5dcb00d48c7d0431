//! The soak's report: what ran, what was checked, what broke.

use std::fmt::Write;
use std::time::Duration;

use super::checker::Verdict;
use super::record::Records;

/// A plain-text report of a run whose clients ran for `ran`, and its check.
pub fn render(records: &Records, verdict: &Verdict, ran: Duration) -> String {
    let mut out = String::new();
    let seconds = ran.as_secs_f64().max(f64::EPSILON);
    let denials: u64 = records.denials.values().sum();
    let reserves = records.grants.len() as u64 + denials + records.unknown;
    let _ = writeln!(
        out,
        "clients ran {seconds:.1} s: {reserves} reserves ({:.0}/s): {} granted, {denials} denied {:?}, \
         {} unknown outcome; {} other calls unanswered",
        reserves as f64 / seconds,
        records.grants.len(),
        records.denials,
        records.unknown,
        records.unavailable
    );
    let decreases: u64 = verdict.limits.iter().map(|l| l.decreases).sum();
    let carried_out: u64 = verdict.limits.iter().map(|l| l.decreases_carried_out).sum();
    let _ = writeln!(
        out,
        "{} completes, {} abandoned, {} replays checked, \
         {} capacity changes ({decreases} decreases, {carried_out} seen carried out), {} usage samples",
        records.completions.len(),
        records.abandoned,
        records.replays,
        records.changes.len(),
        records.observations.len()
    );
    let _ = writeln!(
        out,
        "{:<36} {:>8} {:>26} {:>10}",
        "limit", "grants", "peak held of capacity", "decreases"
    );
    for limit in &verdict.limits {
        let peak = format!(
            "{}/{} {:.1}%",
            limit.peak_held,
            limit.peak_capacity,
            limit.peak_utilisation * 100.0
        );
        let _ = writeln!(
            out,
            "{:<36} {:>8} {:>26} {:>5}/{:<4}",
            limit.key, limit.grants, peak, limit.decreases_carried_out, limit.decreases
        );
    }
    let _ = writeln!(
        out,
        "over-admissions: {}; anomalies: {}{}",
        verdict.violations_total,
        records.anomalies_total + verdict.anomalies.len() as u64,
        if records.truncated { "; RECORDS TRUNCATED" } else { "" }
    );
    for violation in &verdict.violations {
        let _ = writeln!(
            out,
            "  OVER-ADMISSION {} at {}: {} held, capacity at most {}",
            violation.key, violation.at_ms, violation.held, violation.capacity
        );
    }
    for anomaly in records.anomalies.iter().chain(&verdict.anomalies) {
        let _ = writeln!(out, "  ANOMALY {anomaly}");
    }
    out
}

/// True when the run is complete and nothing broke a rule.
pub fn passed(records: &Records, verdict: &Verdict) -> bool {
    verdict.holds() && records.anomalies_total == 0 && !records.truncated
}
