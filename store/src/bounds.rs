//! Keeping the state file bounded under calls that name volumes that never get anywhere. A
//! volume's journal is bounded already (its newest lines); the number of volumes is bounded
//! here: the lines of a call that failed before it changed anything on the host are kept only
//! for a volume some record names (see the agent's `node::journal`), and journals that hold
//! nothing else, left by older agents, are pruned at start.

use std::collections::BTreeMap;

use redb::ReadableTable;

use crate::{
    FORMATS, JOURNAL, LOOP_VOLUMES, PUBLICATIONS, STAGED, StepRecord, Store, StoreError, decode,
    open_table,
};

impl Store {
    /// Whether a record names the volume: a loop volume, a format fact, a staging, a publication
    /// or a journal line. A volume none names is unknown to this node.
    pub fn knows_volume(&self, id: &str) -> Result<bool, StoreError> {
        let tx = self.read_tx()?;
        for def in [LOOP_VOLUMES, FORMATS, STAGED] {
            if let Some(t) = open_table(&tx, def)?
                && t.get(id)?.is_some()
            {
                return Ok(true);
            }
        }
        if let Some(t) = open_table(&tx, PUBLICATIONS)?
            && let Some(row) = t.range((id, "")..)?.next()
            && row?.0.value().0 == id
        {
            return Ok(true);
        }
        if let Some(t) = open_table(&tx, JOURNAL)?
            && t.range((id, 0)..=(id, u64::MAX))?.next().is_some()
        {
            return Ok(true);
        }
        Ok(false)
    }

    /// Volumes that only a journal names, and whose every line is one of `steps` (steps that
    /// change nothing on the host): what to forget at start.
    pub fn journals_only_of(&self, steps: &[&str]) -> Result<Vec<String>, StoreError> {
        let tx = self.read_tx()?;
        let Some(journal) = open_table(&tx, JOURNAL)? else {
            return Ok(Vec::new());
        };
        // Volume → whether every line so far is one of `steps`.
        let mut only: BTreeMap<String, bool> = BTreeMap::new();
        for row in journal.iter()? {
            let (key, value) = row?;
            let id = key.value().0;
            let line: StepRecord = decode(value.value())?;
            let fits = steps.contains(&line.step.as_str());
            match only.get_mut(id) {
                Some(all) => *all &= fits,
                None => {
                    only.insert(id.to_string(), fits);
                }
            }
        }
        let mut out = Vec::new();
        let named = |def, id: &str| -> Result<bool, StoreError> {
            Ok(match open_table(&tx, def)? {
                Some(t) => t.get(id)?.is_some(),
                None => false,
            })
        };
        let publications = open_table(&tx, PUBLICATIONS)?;
        for (id, all) in only {
            if !all || named(LOOP_VOLUMES, &id)? || named(FORMATS, &id)? || named(STAGED, &id)? {
                continue;
            }
            if let Some(t) = &publications
                && let Some(row) = t.range((id.as_str(), "")..)?.next()
                && row?.0.value().0 == id
            {
                continue;
            }
            out.push(id);
        }
        Ok(out)
    }
}
