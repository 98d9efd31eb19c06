//! What an autonomous agent last reported to the principal per object, kept across restarts.
//!
//! Owns: [`Reported`], the [`owned_checksum`](argocd_agent_proto::sync::resync::owned_checksum)
//! (spec, status, operation, labels, annotations) of the last `create` or `spec-update` queued per
//! (kind, name), in a small append-only file under `--queue-dir` ([`REPORTED_FILE`]: one line
//! `<kind> <name> <hex checksum>` per report, `<kind> <name> -` per deletion, the last line of a
//! name winning), compacted on open and once dead lines dominate. Queued is as good as ACKed
//! here: the outbox is durable too, so what was queued reaches the principal.
//!
//! Why: upstream's principal resyncs an autonomous agent by spec checksum alone, so after a
//! restart it cannot tell which objects' status (or labels) changed while the agent was down. The
//! agent answers its `request-update` with the object only when the spec differs or what it does
//! not compare changed since this record ([`crate::autonomous`]).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use tracing::warn;

use crate::spoke_copy::SyncedKind;

/// File name of the record under the queue directory.
pub const REPORTED_FILE: &str = "reported-checksums";

/// Lines below this are never compacted.
const COMPACT_MIN_LINES: usize = 1024;

/// The kinds an autonomous agent reports, by the name the file gives them.
const KINDS: [SyncedKind; 2] = [SyncedKind::Application, SyncedKind::AppProject];

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of lowercase or uppercase hex `s`; `None` for anything else (`-` included).
fn from_hex(s: &str) -> Option<Vec<u8>> {
    if s.is_empty() || !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|d| u8::from_str_radix(d, 16).ok()))
        .collect()
}

/// The record (see the module docs); in memory only when opened without a directory.
#[derive(Debug, Default)]
pub struct Reported {
    checksums: HashMap<(SyncedKind, String), Vec<u8>>,
    file: Option<(PathBuf, File)>,
    /// Lines in the file.
    lines: usize,
    /// The last write failure, logged once until writes work again.
    failure: Option<String>,
}

impl Reported {
    /// The record kept in `dir` (read, then rewritten with only its live lines); an unreadable
    /// line is skipped (its object is then reported on the next resync, as if unknown).
    pub fn open(dir: &Path) -> std::io::Result<Reported> {
        let path = dir.join(REPORTED_FILE);
        let mut checksums = HashMap::new();
        match File::open(&path) {
            Ok(f) => {
                for line in BufReader::new(f).lines() {
                    let line = line?;
                    let mut words = line.split(' ');
                    let (Some(kind), Some(name), Some(sum), None) =
                        (words.next(), words.next(), words.next(), words.next())
                    else {
                        continue;
                    };
                    let Some(kind) = KINDS.into_iter().find(|k| k.kind() == kind) else {
                        continue;
                    };
                    let key = (kind, name.to_string());
                    match from_hex(sum) {
                        Some(sum) => checksums.insert(key, sum),
                        None => checksums.remove(&key),
                    };
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut reported = Reported {
            checksums,
            ..Reported::default()
        };
        reported.rewrite(&path)?;
        Ok(reported)
    }

    /// The checksum last reported for `kind`/`name`, if any.
    pub fn get(&self, kind: SyncedKind, name: &str) -> Option<&[u8]> {
        self.checksums
            .get(&(kind, name.to_string()))
            .map(Vec::as_slice)
    }

    /// Records a report of `kind`/`name` with `checksum`.
    pub fn set(&mut self, kind: SyncedKind, name: &str, checksum: &[u8]) {
        let key = (kind, name.to_string());
        if self.checksums.get(&key).map(Vec::as_slice) == Some(checksum) {
            return;
        }
        self.append(&format!("{} {name} {}\n", kind.kind(), to_hex(checksum)));
        self.checksums.insert(key, checksum.to_vec());
    }

    /// Records that `kind`/`name` was reported deleted.
    pub fn remove(&mut self, kind: SyncedKind, name: &str) {
        if self.checksums.remove(&(kind, name.to_string())).is_some() {
            self.append(&format!("{} {name} -\n", kind.kind()));
        }
    }

    fn append(&mut self, line: &str) {
        let Some((path, file)) = self.file.as_mut() else {
            return;
        };
        match file.write_all(line.as_bytes()) {
            Ok(()) => {
                self.lines += 1;
                self.failure = None;
            }
            Err(e) => {
                let msg = e.to_string();
                if self.failure.as_deref() != Some(msg.as_str()) {
                    warn!(file = %path.display(), error = %msg, "cannot record what was reported to the principal; after a restart behind a principal comparing specs only, unrecorded objects are sent again");
                    self.failure = Some(msg);
                }
            }
        }
        if self.lines >= COMPACT_MIN_LINES && self.lines > self.checksums.len() * 4 {
            let path = path.clone();
            if let Err(e) = self.rewrite(&path) {
                warn!(file = %path.display(), error = %e, "cannot compact the record of what was reported");
            }
        }
    }

    /// Rewrites the file with one line per live entry (through a temporary file and a rename).
    fn rewrite(&mut self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        let mut out = String::new();
        for ((kind, name), sum) in &self.checksums {
            out.push_str(&format!("{} {name} {}\n", kind.kind(), to_hex(sum)));
        }
        std::fs::write(&tmp, out)?;
        std::fs::rename(&tmp, path)?;
        self.file = Some((
            path.to_path_buf(),
            OpenOptions::new().append(true).open(path)?,
        ));
        self.lines = self.checksums.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_survive_a_reopen_the_last_line_winning_and_deletions_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut r = Reported::open(dir.path()).unwrap();
            r.set(SyncedKind::Application, "a", &[1, 2]);
            r.set(SyncedKind::Application, "a", &[3]);
            r.set(SyncedKind::AppProject, "a", &[4]);
            r.set(SyncedKind::Application, "gone", &[5]);
            r.remove(SyncedKind::Application, "gone");
        }
        let mut r = Reported::open(dir.path()).unwrap();
        assert_eq!(r.get(SyncedKind::Application, "a"), Some(&[3u8][..]));
        assert_eq!(r.get(SyncedKind::AppProject, "a"), Some(&[4u8][..]));
        assert_eq!(r.get(SyncedKind::Application, "gone"), None);
        let text = std::fs::read_to_string(dir.path().join(REPORTED_FILE)).unwrap();
        assert_eq!(text.lines().count(), 2, "compacted on open: {text}");
        for i in 0..5000 {
            r.set(SyncedKind::Application, "a", &[(i % 7) as u8 + 10]);
        }
        let lines = std::fs::read_to_string(dir.path().join(REPORTED_FILE))
            .unwrap()
            .lines()
            .count();
        assert!(
            lines < COMPACT_MIN_LINES,
            "compacted while running: {lines}"
        );
    }

    #[test]
    fn garbage_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(REPORTED_FILE),
            "nonsense\nApplication a zz\nWidget w 01\nApplication b 0a\n",
        )
        .unwrap();
        let r = Reported::open(dir.path()).unwrap();
        assert_eq!(r.get(SyncedKind::Application, "a"), None);
        assert_eq!(r.get(SyncedKind::Application, "b"), Some(&[10u8][..]));
    }
}
