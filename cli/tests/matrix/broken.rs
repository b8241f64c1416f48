//! The matrix catches broken locks: each deliberately broken variant (`tenure matrix
//! --backends broken:NAME`, a thin wrapper over a real backend) is run on the cell that
//! targets it, which must read outside its real backend's expected verdicts (⚠), with
//! the reason in the cell's notes.

use std::process::Command;

use serde_json::Value;

/// Runs the matrix on `variant`, trimmed to `fault`, and returns that cell's outcome.
fn cell(variant: &str, fault: &str) -> Value {
    let _turn = crate::one_at_a_time();
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tenure"))
        .args(["matrix", "--trials", "3", "--backends"])
        .arg(format!("broken:{variant}"))
        .args(["--faults", fault, "--out"])
        .arg(out_dir.path())
        .env_remove("TENURE_URL")
        .output()
        .expect("tenure runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let json = std::fs::read_to_string(out_dir.path().join("matrix.json"))
        .unwrap_or_else(|e| panic!("no matrix.json ({e}): {stderr}"));
    let json: Value = serde_json::from_str(&json).unwrap();
    let backend = &json["backends"][0];
    assert_eq!(backend["backend"], format!("broken:{variant}"));
    assert!(backend["error"].is_null(), "{}", backend["error"]);
    assert_eq!(backend["suite"], Value::Array(Vec::new()), "trimmed run");
    let faults = backend["faults"].as_array().unwrap();
    assert_eq!(faults.len(), 1, "only the {fault} cell: {faults:?}");
    assert_eq!(faults[0]["fault"], fault);
    faults[0].clone()
}

/// Asserts that `fault` catches `variant`: a fired trial outside the expected verdicts,
/// and a note containing `reason`.
fn caught(variant: &str, fault: &str, reason: &str) {
    let outcome = cell(variant, fault);
    let cell = &outcome["cell"];
    assert_eq!(cell["status"], "ran", "{outcome}");
    let expected = outcome["expected"].as_array().unwrap();
    let counts = cell["counts"].as_object().unwrap();
    let outside: Vec<&String> = counts
        .keys()
        .filter(|v| !expected.contains(&Value::String((*v).clone())))
        .collect();
    assert!(
        !outside.is_empty() && outcome["mismatch"] == true,
        "broken:{variant} passed the {fault} cell: {outcome}"
    );
    let notes = cell["notes"].as_array().unwrap();
    assert!(
        notes.iter().any(|n| n.as_str().unwrap().contains(reason)),
        "broken:{variant} on {fault}: no note with {reason:?}: {outcome}"
    );
}

#[test]
fn lists_the_variants_and_rejects_unknown_names() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tenure"))
            .args(args)
            .output()
            .expect("tenure runs")
    };
    let listed = run(&["matrix", "--list-broken"]);
    assert!(listed.status.success());
    let names = String::from_utf8(listed.stdout).unwrap();
    assert_eq!(names.lines().count(), 15, "{names}");
    assert!(names.lines().any(|n| n == "setnx-then-expire"), "{names}");
    let help = String::from_utf8(run(&["matrix", "--help"]).stdout).unwrap();
    assert!(
        help.contains("--faults") && !help.contains("broken"),
        "{help}"
    );
    for (args, says) in [
        (&["matrix", "--faults", "nope"][..], "known: paused-holder"),
        (
            &["matrix", "--backends", "broken:nope"][..],
            "no broken variant",
        ),
    ] {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(says), "{stderr}");
    }
}

#[test]
fn setnx_then_expire_is_caught_by_a_lost_reply() {
    // SETNX ran, its reply was lost: PEXPIRE never went out and the key never expires.
    caught(
        "setnx-then-expire",
        "lost-reply",
        "the orphan was never cleared",
    );
}

#[test]
fn a_fixed_lock_value_is_caught_by_a_connection_cut() {
    // Every client is "the owner": the contender is granted the holder's lock at once.
    caught(
        "fixed-value",
        "connection-cut",
        "checker: holder and contender held at once; same token",
    );
}

#[test]
fn a_local_token_counter_is_caught_by_a_blackhole() {
    // Each client counts from 1: the contender's token repeats the holder's.
    caught("local-counter-token", "blackhole", "checker: ");
}

#[test]
fn etcd_ignoring_expiry_is_caught_by_a_blackhole() {
    // Unanswered keep-alives taken as renewals: the holder believes past its lease.
    caught(
        "etcd-ignores-expiry",
        "blackhole",
        "checker: holder and contender held at once",
    );
}

#[test]
fn zk_disconnected_as_held_is_caught_by_a_blackhole() {
    // A disconnected session presumed alive while the ensemble expires it.
    caught(
        "zk-disconnected-held",
        "blackhole",
        "checker: holder and contender held at once",
    );
}

#[test]
fn a_postgres_fence_in_the_lock_transaction_is_caught_by_a_connection_cut() {
    // The cut holder's fence raise rolls back: the contender gets the same token.
    caught(
        "pg-fence-in-txn",
        "connection-cut",
        "checker: a token was issued twice",
    );
}

#[test]
fn a_deadline_from_the_reply_is_caught_by_delayed_replies() {
    // The late grant is believed from its reply on: past the TTL from the request, and
    // over the contender's hold.
    caught("deadline-from-reply", "delayed-reply", "checker: ");
}

#[test]
fn redlock_without_the_validity_check_is_caught_by_delayed_replies() {
    // The same on a quorum whose replies all came after the TTL.
    caught("redlock-no-validity", "delayed-reply", "checker: ");
}

#[test]
fn del_without_owner_check_is_caught_by_a_blackhole() {
    // The cut-off holder releases when its work ends, after the takeover: its DEL frees
    // the contender's lock, and the witness is granted it.
    caught(
        "del-without-owner-check",
        "blackhole",
        "checker: contender and witness held at once",
    );
}

#[test]
fn a_get_then_del_release_is_caught_by_delayed_replies() {
    // The holder's GET is answered after its lease ran out and the contender was granted:
    // its DEL then frees the contender's lock, and the witness is granted it.
    caught(
        "get-del-release",
        "delayed-reply",
        "checker: contender and witness held at once",
    );
}

#[test]
fn an_extend_that_reacquires_is_caught_by_a_connection_cut() {
    // After the takeover the holder tries once to extend the lease the contender took
    // and gave back: the broken extend takes the lock again, and the extended hold spans
    // the contender's.
    caught("extend-reacquires", "connection-cut", "checker: ");
}

#[test]
fn redlock_accepting_a_minority_is_caught_by_a_minority_partition() {
    // The holder, cut off from a majority of the masters, keeps renewing on its minority
    // while the contender is granted on the majority.
    caught(
        "redlock-minority",
        "minority-partition",
        "checker: holder and contender held at once",
    );
}

#[test]
fn an_owner_reused_across_retries_is_caught_by_a_stale_acquire() {
    // Redlock rounds of one acquire under one owner id: the first round's grants stall,
    // it withdraws them (behind them, on their connections) and the next round is granted
    // over fresh ones; the stalled withdrawals land last and delete the lease's grants.
    caught(
        "owner-reused-across-retries",
        "stale-acquire",
        "checker: holder and contender held at once",
    );
}

#[test]
fn a_deadline_on_a_stopping_clock_is_caught_by_a_client_suspend() {
    // The holder's machine sleeps past its TTL; on waking its clock that cannot tell the
    // suspend says the lease is still good, so it writes after the contender's grant.
    caught(
        "deadline-on-a-stopping-clock",
        "client-suspend",
        "the woken holder's write after the takeover",
    );
}

/// tenure's ZooKeeper client before it named its nodes as Curator's and queued behind
/// every other recipe's: Curator's real client is granted beside it, and it beside
/// Curator's.
#[test]
fn zk_blind_to_other_recipes_is_caught_by_a_mixed_fleet() {
    caught("zk-foreign-nodes-ignored", "mixed-fleet", "granted while");
}
