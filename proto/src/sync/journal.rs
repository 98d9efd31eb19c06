//! The on-disk form of an [`Outbox`](super::Outbox): an append-only journal of "queued" and
//! "confirmed" records, each framed with its length and a checksum, compacted by rewriting it
//! with only the live events once it has grown well past them.
//!
//! Layout: the header `ARGOQ1\n`, then records `[kind u8][len u32 LE][sha256(payload)[..8]][payload]`.
//! A `Queued` payload is the event as a protobuf CloudEvent (its `deliveryid` extension included);
//! a `Confirmed` payload is `<resource key>\n<delivery id>`. Replaying the records through the
//! outbox's own coalescing rules rebuilds the queue exactly as far as it matters (the latest
//! state of every resource, every operation not yet confirmed).
//!
//! Damage (a bad header, a checksum mismatch, a record cut short by a crash mid-write) is never
//! fatal: replay keeps the records before the damage, reports it, and the caller answers with a
//! full resync; the journal is then rewritten clean. Records are written to the OS on every change
//! (a killed process loses nothing) and flushed to the disk at most every [`SYNC_EVERY`].

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::event::Event;

/// The journal's file name inside the queue directory.
pub const JOURNAL_FILE: &str = "outbox.journal";
const HEADER: &[u8] = b"ARGOQ1\n";
const KIND_QUEUED: u8 = 1;
const KIND_CONFIRMED: u8 = 2;
/// Largest record accepted on replay; anything bigger is damage, not data.
const MAX_RECORD: usize = 256 * 1024 * 1024;
/// Longest time a written record may sit in the OS cache before it is flushed to the disk.
pub const SYNC_EVERY: Duration = Duration::from_millis(500);

/// One replayed record.
#[derive(Debug)]
pub enum Record {
    /// An event was queued.
    Queued(Box<Event>),
    /// The peer confirmed the event with this delivery id for this resource key.
    Confirmed {
        /// Resource key of the confirmed event.
        key: String,
        /// Its delivery id.
        delivery: String,
    },
}

/// What reading a journal found.
#[derive(Debug, Default)]
pub struct Replay {
    /// The intact records, in order.
    pub records: Vec<Record>,
    /// Where and why the journal was damaged, if it was.
    pub damage: Option<String>,
}

/// An open journal file, appended to.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    out: BufWriter<File>,
    records: usize,
    last_sync: Instant,
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(payload.len() + 13);
    buf.push(kind);
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&Sha256::digest(payload)[..8]);
    buf.extend_from_slice(payload);
    buf
}

/// Reads the journal at `path` (a missing file is an empty journal).
pub fn replay(path: &Path) -> std::io::Result<Replay> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_end(&mut bytes)?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Replay::default()),
        Err(e) => return Err(e),
    }
    Ok(replay_bytes(&bytes))
}

/// Reads a journal from its file contents: the intact records before any damage, and the
/// damage if there is some. Never fails and never panics, whatever `bytes` holds.
pub fn replay_bytes(bytes: &[u8]) -> Replay {
    let mut out = Replay::default();
    if bytes.is_empty() {
        return out;
    }
    if !bytes.starts_with(HEADER) {
        out.damage = Some("the file does not start with the outbox journal header".into());
        return out;
    }
    let mut pos = HEADER.len();
    while pos < bytes.len() {
        let at = pos;
        let damage = |why: &str| Some(format!("record at byte {at}: {why}"));
        if bytes.len() - pos < 13 {
            out.damage = damage("truncated record header");
            break;
        }
        let kind = bytes[pos];
        let len = u32::from_le_bytes(bytes[pos + 1..pos + 5].try_into().expect("4 bytes")) as usize;
        let sum = &bytes[pos + 5..pos + 13];
        pos += 13;
        if len > MAX_RECORD || bytes.len() - pos < len {
            out.damage = damage("truncated record");
            break;
        }
        let payload = &bytes[pos..pos + len];
        pos += len;
        if &Sha256::digest(payload)[..8] != sum {
            out.damage = damage("checksum mismatch");
            break;
        }
        let record = match kind {
            KIND_QUEUED => match Event::decode(payload) {
                Ok(ev) => Record::Queued(Box::new(ev)),
                Err(e) => {
                    out.damage = damage(&format!("undecodable event: {e}"));
                    break;
                }
            },
            KIND_CONFIRMED => {
                let text = String::from_utf8_lossy(payload);
                let Some((key, delivery)) = text.split_once('\n') else {
                    out.damage = damage("malformed confirmation");
                    break;
                };
                Record::Confirmed {
                    key: key.to_string(),
                    delivery: delivery.to_string(),
                }
            }
            other => {
                out.damage = damage(&format!("unknown record kind {other}"));
                break;
            }
        };
        out.records.push(record);
    }
    out
}

impl Journal {
    /// Writes a fresh journal at `path` holding `events` (atomically: temp file, fsync, rename)
    /// and opens it for appending.
    pub fn rewrite<'a>(
        path: &Path,
        events: impl Iterator<Item = &'a Event>,
    ) -> std::io::Result<Journal> {
        let tmp = path.with_extension("journal.tmp");
        let mut count = 0;
        {
            let mut w = BufWriter::new(File::create(&tmp)?);
            w.write_all(HEADER)?;
            for ev in events {
                w.write_all(&frame(KIND_QUEUED, &ev.encode_to_vec()))?;
                count += 1;
            }
            w.flush()?;
            w.get_ref().sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        let file = OpenOptions::new().append(true).open(path)?;
        Ok(Journal {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
            records: count,
            last_sync: Instant::now(),
        })
    }

    /// The journal's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records written since the last rewrite (live and dead).
    pub fn records(&self) -> usize {
        self.records
    }

    /// Appends "queued `ev`".
    pub fn queued(&mut self, ev: &Event) -> std::io::Result<()> {
        self.append(&frame(KIND_QUEUED, &ev.encode_to_vec()))
    }

    /// Appends "confirmed `delivery` of `key`".
    pub fn confirmed(&mut self, key: &str, delivery: &str) -> std::io::Result<()> {
        self.append(&frame(
            KIND_CONFIRMED,
            format!("{key}\n{delivery}").as_bytes(),
        ))
    }

    fn append(&mut self, record: &[u8]) -> std::io::Result<()> {
        self.out.write_all(record)?;
        self.out.flush()?;
        self.records += 1;
        if self.last_sync.elapsed() >= SYNC_EVERY {
            self.out.get_ref().sync_data()?;
            self.last_sync = Instant::now();
        }
        Ok(())
    }
}
