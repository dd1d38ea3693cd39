//! The read-only views of the live state (issue 18, issue 22): the job row `mam jobs` and `mam ui`
//! share (`view::jobs`), the incremental reader of the registry, the sessions file and the loops
//! (`view::scan`), the assembled screen data (`view::world`) and the helper threads that list the
//! pane servers and read the bus (`view::live`).
//!
//! Nothing here writes, locks or creates a file, and nothing prints.

pub mod jobs;
pub mod live;
pub mod scan;
pub mod world;
