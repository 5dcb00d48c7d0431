//! The benchmarks' command line: `--flag value` pairs, read in order, every
//! problem a usage error that names the benchmark, the problem and its usage
//! line, and exits 2. Each benchmark keeps its own flags, defaults and bounds;
//! this only reads them. The replay's benchmarks reach it through
//! `bench_support`; `ratelimiterd`'s `budget_proof` includes this file by path,
//! so no library carries benchmark code.

/// The exit code of a command line that cannot be read.
pub const USAGE_EXIT_CODE: i32 = 2;

/// The `--flag value` pairs of one benchmark's command line.
pub struct Flags {
    /// The benchmark's name, first on every error line.
    program: &'static str,
    /// Its flags as the usage line shows them, after the name.
    usage: &'static str,
    args: std::iter::Skip<std::env::Args>,
}

impl Flags {
    /// The flags this process was started with, for the benchmark `program`
    /// whose usage line is `usage: <program> <usage>`.
    pub fn from_env(program: &'static str, usage: &'static str) -> Self {
        Self {
            program,
            usage,
            args: std::env::args().skip(1),
        }
    }

    /// `value` of `flag` read as a `T`; else a usage error saying it is not
    /// `a_what` ("a number", "a count").
    pub fn parse<T: std::str::FromStr>(&self, flag: &str, value: &str, a_what: &str) -> T {
        (value.parse::<T>()).unwrap_or_else(|_| self.fail(&format!("{flag}: not {a_what}")))
    }

    /// Ends the process on a command line it cannot run: `problem`, then the
    /// usage line, on stderr.
    pub fn fail(&self, problem: &str) -> ! {
        eprintln!("{}: {problem}", self.program);
        eprintln!("usage: {} {}", self.program, self.usage);
        std::process::exit(USAGE_EXIT_CODE);
    }
}

impl Iterator for Flags {
    /// A flag and its value.
    type Item = (String, String);

    /// The next flag and its value; a flag without a value is a usage error.
    fn next(&mut self) -> Option<(String, String)> {
        let flag = self.args.next()?;
        let value = (self.args.next()).unwrap_or_else(|| self.fail(&format!("{flag} needs a value")));
        Some((flag, value))
    }
}
