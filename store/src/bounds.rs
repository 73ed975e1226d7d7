//! Keeping the state file bounded under calls that name volumes that never get anywhere. A
//! volume's journal is bounded already (its newest lines); the number of volumes is bounded
//! here: the lines of a call that failed before it changed anything on the host are kept only
//! for a volume some record names (see the agent's `node::journal`), and journals that hold
//! nothing else, left by older agents, are pruned at start.

use std::collections::BTreeMap;

use redb::ReadableTable;

use crate::{JOURNAL, StepRecord, Store, StoreError, decode, open_table};

impl Store {
    /// Volumes that only a journal names, and whose every line is one of `steps` (steps that
    /// change nothing on the host): what to forget at start.
    pub fn journals_only_of(&self, steps: &[&str]) -> Result<Vec<String>, StoreError> {
        let view = self.view(None)?;
        // Volume → whether every line so far is one of `steps`.
        let mut only: BTreeMap<String, bool> = BTreeMap::new();
        let mut saw = |id: &str, line: &StepRecord| {
            let fits = steps.contains(&line.step.as_str());
            match only.get_mut(id) {
                Some(all) => *all &= fits,
                None => {
                    only.insert(id.to_string(), fits);
                }
            }
        };
        if let Some(journal) = open_table(&view.tx, JOURNAL)? {
            for row in journal.iter()? {
                let (key, value) = row?;
                saw(key.value().0, &decode(value.value())?);
            }
        }
        for (id, o) in &view.over {
            for (_, line) in &o.steps {
                saw(id, line);
            }
        }
        let mut out = Vec::new();
        for (id, all) in only {
            if all && !Store::names_beyond_journal(&view, &id)? {
                out.push(id);
            }
        }
        Ok(out)
    }
}
