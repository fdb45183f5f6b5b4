//! Wakes the desired-state watchers of the nodes an apply changed, and only those: with
//! thousands of agents watching, a change to one service must not wake every stream (each
//! would then re-read its node's state to find nothing new).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

#[derive(Default)]
pub struct NodeWakers {
    senders: Mutex<HashMap<String, watch::Sender<()>>>,
}

impl NodeWakers {
    /// A receiver that sees a change whenever `node`'s desired state may have changed.
    pub fn subscribe(&self, node: &str) -> watch::Receiver<()> {
        let mut senders = self.senders.lock().expect("wakers lock");
        senders.entry(node.to_string()).or_insert_with(|| watch::channel(()).0).subscribe()
    }

    /// Wakes the watchers of `nodes`; forgets nodes nobody watches any more.
    pub fn wake<'a>(&self, nodes: impl IntoIterator<Item = &'a String>) {
        let mut senders = self.senders.lock().expect("wakers lock");
        for node in nodes {
            if let Some(tx) = senders.get(node) {
                if tx.receiver_count() == 0 {
                    senders.remove(node);
                } else {
                    tx.send_replace(());
                }
            }
        }
    }

    /// Wakes every watcher (the whole state was replaced).
    pub fn wake_all(&self) {
        self.senders.lock().expect("wakers lock").retain(|_, tx| {
            tx.send_replace(());
            tx.receiver_count() > 0
        });
    }

    /// How many nodes have a watcher registered.
    #[cfg(test)]
    fn watched_nodes(&self) -> usize {
        self.senders.lock().expect("wakers lock").values().filter(|tx| tx.receiver_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_nodes_are_woken() {
        let wakers = NodeWakers::default();
        let mut a = wakers.subscribe("a");
        let b = wakers.subscribe("b");
        wakers.wake([&"a".to_string(), &"c".to_string()]);
        assert!(a.has_changed().unwrap());
        assert!(!b.has_changed().unwrap());
        a.borrow_and_update();
        wakers.wake_all();
        assert!(a.has_changed().unwrap() && b.has_changed().unwrap());
    }

    #[test]
    fn nodes_nobody_watches_are_forgotten() {
        let wakers = NodeWakers::default();
        drop(wakers.subscribe("a"));
        let _b = wakers.subscribe("b");
        wakers.wake([&"a".to_string()]);
        assert_eq!(wakers.watched_nodes(), 1);
        assert_eq!(wakers.senders.lock().unwrap().len(), 1);
    }
}
