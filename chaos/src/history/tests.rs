use super::*;

fn write(rec: &mut ClientRecorder, key: &str, value: &str) {
    let id = rec.invoke(key, Op::Write(value.into()));
    rec.returned(id, Ret::WriteOk);
}

fn read(rec: &mut ClientRecorder, key: &str, value: Option<&str>) {
    let id = rec.invoke(key, Op::Read);
    rec.returned(id, Ret::ReadOk(value.map(String::from)));
}

#[test]
fn sequential_history_is_linearizable() {
    let h = History::new();
    let mut a = h.client();
    read(&mut a, "k", None);
    write(&mut a, "k", "1");
    read(&mut a, "k", Some("1"));
    write(&mut a, "k", "2");
    read(&mut a, "k", Some("2"));
    let v = check(&h);
    assert!(v.linearizable, "{v:?}");
    assert_eq!((v.operations, v.acknowledged_writes, v.keys, v.lost_writes), (5, 2, 1, 0));
}

#[test]
fn stale_read_after_an_acknowledged_write_is_not_linearizable() {
    let h = History::new();
    let (mut a, mut b) = (h.client(), h.client());
    write(&mut a, "k", "1");
    write(&mut a, "k", "2");
    read(&mut b, "k", Some("1"));
    let v = check(&h);
    assert!(!v.linearizable);
    let failure = v.failure.unwrap();
    assert!(failure.starts_with("key \"k\": no linearization"), "{failure}");
    assert!(failure.contains("Read"), "{failure}");
    assert_eq!(v.lost_writes, 1, "the read proves the write of 2 lost");
}

#[test]
fn a_read_concurrent_with_a_write_may_see_either_value() {
    for seen in [Some("1"), Some("2")] {
        let h = History::new();
        let (mut a, mut b) = (h.client(), h.client());
        write(&mut a, "k", "1");
        let w = a.invoke("k", Op::Write("2".into()));
        read(&mut b, "k", seen);
        a.returned(w, Ret::WriteOk);
        assert!(check(&h).linearizable, "read of {seen:?}");
    }
}

#[test]
fn an_unknown_write_may_or_may_not_take_effect_but_a_failed_one_never_does() {
    for seen in [Some("1"), Some("2")] {
        let h = History::new();
        let (mut a, mut b) = (h.client(), h.client());
        write(&mut a, "k", "1");
        let w = a.invoke("k", Op::Write("2".into()));
        a.unknown(w);
        // The same client goes on (under a new thread id) while its write may still land.
        write(&mut a, "other", "x");
        read(&mut b, "k", seen);
        let v = check(&h);
        assert!(v.linearizable, "read of {seen:?}: {v:?}");
        assert_eq!(v.unknown, 1);
    }
    let h = History::new();
    let (mut a, mut b) = (h.client(), h.client());
    write(&mut a, "k", "1");
    let w = a.invoke("k", Op::Write("2".into()));
    a.failed(w);
    read(&mut b, "k", Some("2"));
    let v = check(&h);
    assert!(!v.linearizable, "a failed write must not be observed");
    assert_eq!(v.failed, 1);
}

#[test]
fn an_unknown_write_cannot_be_undone_once_observed() {
    let h = History::new();
    let (mut a, mut b) = (h.client(), h.client());
    write(&mut a, "k", "1");
    let w = a.invoke("k", Op::Write("2".into()));
    a.unknown(w);
    read(&mut b, "k", Some("2"));
    read(&mut b, "k", Some("1"));
    assert!(!check(&h).linearizable);
}

#[test]
fn reading_nothing_after_acknowledged_writes_counts_them_lost() {
    let h = History::new();
    let (mut a, mut b) = (h.client(), h.client());
    write(&mut a, "k", "1");
    write(&mut a, "k", "2");
    read(&mut b, "k", None);
    let v = check(&h);
    assert!(!v.linearizable);
    assert_eq!(v.lost_writes, 2);
}

#[test]
fn keys_are_checked_separately_and_failures_name_the_key() {
    let h = History::new();
    let (mut a, mut b) = (h.client(), h.client());
    write(&mut a, "good", "g1");
    read(&mut b, "good", Some("g1"));
    write(&mut a, "bad", "b1");
    read(&mut b, "bad", None);
    let v = check(&h);
    assert_eq!(v.keys, 2);
    assert!(v.failure.unwrap().starts_with("key \"bad\""));
}

#[test]
fn duplicate_written_values_make_the_history_malformed() {
    let h = History::new();
    let mut a = h.client();
    write(&mut a, "k", "same");
    write(&mut a, "j", "same");
    let v = check(&h);
    assert!(!v.linearizable);
    assert!(v.failure.unwrap().contains("written twice"));
}

#[test]
#[should_panic(expected = "before the previous one ended")]
fn a_client_cannot_overlap_its_own_operations() {
    let h = History::new();
    let mut a = h.client();
    a.invoke("k", Op::Read);
    a.invoke("k", Op::Read);
}

#[test]
fn many_concurrent_clients_on_a_correct_register_check_quickly() {
    const ROUNDS: usize = 60;
    // A register driven by interleaved clients; each operation takes effect when it
    // returns, a point inside its interval, so the history is linearizable.
    let h = History::new();
    let mut clients: Vec<ClientRecorder> = (0..5).map(|_| h.client()).collect();
    let mut value: Option<String> = None;
    let mut next = 0u32;
    for round in 0..ROUNDS {
        let mut in_flight = Vec::new();
        for (i, c) in clients.iter_mut().enumerate() {
            let op = if (round + i) % 3 == 0 {
                next += 1;
                Op::Write(format!("v{next}"))
            } else {
                Op::Read
            };
            in_flight.push((c.invoke("k", op.clone()), op));
        }
        // Return in reverse order of invocation so that intervals overlap.
        for (c, (id, op)) in clients.iter_mut().zip(in_flight).rev() {
            match op {
                Op::Write(v) => {
                    value = Some(v);
                    c.returned(id, Ret::WriteOk);
                }
                Op::Read => c.returned(id, Ret::ReadOk(value.clone())),
            }
        }
    }
    let v = check(&h);
    assert!(v.linearizable, "{:?}", v.failure);
    assert_eq!(v.operations, 5 * ROUNDS);
}

#[test]
fn a_key_with_a_long_history_is_checked_without_overflowing_the_stack() {
    // The tester recurses once per operation; a test thread has 2 MiB of stack, which this
    // history overflows when checked in place (a 50-kill run overflowed the main thread's 8).
    const OPERATIONS: usize = 4_000;
    let h = History::new();
    let mut a = h.client();
    for n in 0..OPERATIONS / 2 {
        let value = format!("v{n}");
        write(&mut a, "k", &value);
        read(&mut a, "k", Some(&value));
    }
    let v = check(&h);
    assert!(v.linearizable, "{:?}", v.failure);
    assert_eq!(v.operations, OPERATIONS);
}
