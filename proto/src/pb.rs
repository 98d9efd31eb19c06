//! Generated protobuf messages and tonic clients/servers for the upstream-compatible wire contract.
//!
//! Owns the Rust view of `proto/*.proto`: `authapi`, `versionapi`, `eventstreamapi`,
//! `principal.apis.logstreamapi`, `terminalstreamapi` and the CloudEvents 1.0 envelope `io.cloudevents.v1`. Module
//! nesting mirrors the protobuf packages (the generated code refers to sibling packages through
//! `super::`); the short aliases [`cloudevents`] and [`logstreamapi`] are what callers use.
//!
//! Full gRPC method paths (fixed by upstream, asserted in tests):
//! `/authapi.Authentication/Authenticate`, `/authapi.Authentication/RefreshToken`,
//! `/versionapi.Version/Version`, `/eventstreamapi.EventStream/Subscribe`,
//! `/eventstreamapi.EventStream/Push`, `/eventstreamapi.EventStream/Ping`,
//! `/principal.apis.logstreamapi.LogStreamService/StreamLogs`,
//! `/terminalstreamapi.TerminalStreamService/StreamTerminal`.

#![allow(missing_docs)]
#![allow(clippy::all, clippy::pedantic)]

/// Package `io.*`: holds only the CloudEvents envelope.
pub mod io {
    /// Package `io.cloudevents.*`.
    pub mod cloudevents {
        /// Package `io.cloudevents.v1`: the CloudEvents 1.0 protobuf format.
        pub mod v1 {
            tonic::include_proto!("io.cloudevents.v1");
        }
    }
}

/// Package `authapi`: `Authentication.Authenticate` / `Authentication.RefreshToken`.
pub mod authapi {
    tonic::include_proto!("authapi");
}

/// Package `versionapi`: `Version.Version`.
pub mod versionapi {
    tonic::include_proto!("versionapi");
}

/// Package `eventstreamapi`: `EventStream.Subscribe` (the main bidi stream), `Push`, `Ping`.
pub mod eventstreamapi {
    tonic::include_proto!("eventstreamapi");
}

/// Package `principal.*`: holds only the log stream service.
pub mod principal {
    /// Package `principal.apis.*`.
    pub mod apis {
        /// Package `principal.apis.logstreamapi`: `LogStreamService.StreamLogs`.
        pub mod logstreamapi {
            tonic::include_proto!("principal.apis.logstreamapi");
        }
    }
}

/// Package `terminalstreamapi`: `TerminalStreamService.StreamTerminal` (web terminal sessions).
pub mod terminalstreamapi {
    tonic::include_proto!("terminalstreamapi");
}

/// Short alias for `io.cloudevents.v1`.
pub use io::cloudevents::v1 as cloudevents;
/// Short alias for `principal.apis.logstreamapi`.
pub use principal::apis::logstreamapi;

/// Fully qualified gRPC method paths, as they appear in HTTP/2 `:path` headers.
pub mod paths {
    pub const AUTHENTICATE: &str = "/authapi.Authentication/Authenticate";
    pub const REFRESH_TOKEN: &str = "/authapi.Authentication/RefreshToken";
    pub const VERSION: &str = "/versionapi.Version/Version";
    pub const SUBSCRIBE: &str = "/eventstreamapi.EventStream/Subscribe";
    pub const PUSH: &str = "/eventstreamapi.EventStream/Push";
    pub const PING: &str = "/eventstreamapi.EventStream/Ping";
    pub const STREAM_LOGS: &str = "/principal.apis.logstreamapi.LogStreamService/StreamLogs";
    pub const STREAM_TERMINAL: &str = "/terminalstreamapi.TerminalStreamService/StreamTerminal";

    /// Methods that must be reachable without a JWT (the auth interceptor skips them).
    pub const UNAUTHENTICATED: &[&str] = &[AUTHENTICATE, REFRESH_TOKEN, VERSION];
}
