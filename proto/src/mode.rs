//! How an agent operates: the mode it declares at login and the principal pins.
//!
//! Owns [`AgentMode`] and its wire spelling (`managed`, `autonomous`), as the auth request and
//! upstream's agents write it. Command-line parsing of it (`--mode`, `--allowed-agent-modes`) is
//! the `clap` feature's derive; which mode an agent may use is the principal's business.

use std::fmt;
use std::str::FromStr;

/// How an agent operates (`--mode` on the agent, `--allowed-agent-modes` on the principal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum AgentMode {
    /// The hub is the source of truth for spec; the agent reports status.
    Managed,
    /// The agent is the source of truth; the hub mirrors it.
    Autonomous,
}

impl AgentMode {
    /// The name used on the command line and in the auth request.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentMode::Managed => "managed",
            AgentMode::Autonomous => "autonomous",
        }
    }
}

impl fmt::Display for AgentMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AgentMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "managed" => Ok(AgentMode::Managed),
            "autonomous" => Ok(AgentMode::Autonomous),
            other => Err(format!(
                "unknown agent mode {other:?}: use managed or autonomous"
            )),
        }
    }
}
