// Package cli implements the fencelock command (cmd/fencelock): an operator's view of the
// locks fencelock keeps in a database, and the few actions an operator takes on them.
//
// # Commands
//
//	migrate                       apply fencelock's migrations ([fencelock.Migrate])
//	locks [--name PATTERN]        held leases (fencelock.holders) and advisory locks
//	                              (fencelock.advisory_locks), one table
//	watch [--interval 1s]         the locks table, redrawn until q, ctrl-C or SIGTERM
//	fences [--name PATTERN]       fencing high-water marks (fencelock.fences) and the lease
//	                              holder of the same name
//	release --force NAME [--fence RESOURCE]... [--lock-timeout 5s]
//	                              end the grant of lease NAME, whoever holds it, and fence its
//	                              holder out (fencelock.force_release)
//	release --force --advisory NAME|KEY [--yes]
//	                              terminate the backends that hold an advisory lock
//	sweep [--grace 1h]            delete long-expired lease rows ([fencelock.SweepLeases])
//	ui [--listen 127.0.0.1:8080] [--allow-release]
//	                              the live view of package ui, served until ctx ends
//	version                       the version of the fencelock module the binary was built
//	                              from (its build information: "v0.1.0" from go install
//	                              ...@v0.1.0, "(devel)" with the VCS revision and time from a
//	                              source tree) and the Go version; also "fencelock --version"
//
// "fencelock help" (or -h) prints the usage and exits 0; no command at all prints it to stderr
// and exits 2.
//
// Every command takes --database-url (else the environment variable DATABASE_URL) and --json,
// which prints one JSON document instead of the table: an array of objects for a table, an
// object for an action; watch --json prints one array per refresh, one a line (NDJSON).
// Connections set application_name to "fencelock-cli" unless the URL sets one.
//
// # The locks table
//
// One row per held lease (KIND lease) and per backend holding an advisory lock (KIND
// advisory), leases first, then advisory locks, each sorted by resource. Backends waiting for
// an advisory lock are counted in WAITERS of the holder's row; a key nobody holds shows its
// first waiter, "pid N (waiting, blocked by P,Q)". pg_locks does not tell session advisory
// locks from transaction ones: HEARTBEAT says "session" for both ("session (shared)" for a
// shared lock), and "prepared" with HOLDER "prepared transaction" for a lock of a prepared
// transaction (which has no backend). Durations are rounded to the unit shown: "850ms", "4.2s", "3m05s", "2h01m".
//
// # Watch
//
// watch redraws the table every --interval, clearing the screen (ANSI), under a header line
// "fencelock watch — host/dbname — HH:MM:SS — q to quit". When stdin is a terminal it is put
// into cbreak mode by running stty on /dev/tty (the standard library has no termios calls),
// so a single q quits, and restored on exit, ctrl-C and SIGTERM included; otherwise a line
// "q" quits. With --json it prints one JSON array per refresh, one a line, and clears nothing.
// A failed refresh shows the error and the next refresh tries again.
//
// # Exit codes
//
//	0  ok ([ExitOK])
//	1  an error: the database refused or could not be reached, output could not be written, a
//	   terminated backend did not exit, a lock held by a prepared transaction, or the
//	   operator declined ([ExitError])
//	2  a usage error: unknown command or flag, missing argument or database URL ([ExitUsage])
//	3  nobody held it: no holder found (a lease never granted: nothing changed; a lapsed
//	   grant: its holder fenced out all the same), or the lease's last grant is not the one
//	   --token names, and nothing changed ([ExitNotFound])
//	4  the lease row is locked by a transaction (a RunLocked, the holder's guarded transaction
//	   or a grant in flight): lock timeout, or a deadlock with a holder that fenced before it
//	   guarded; retry ([ExitLockTimeout])
//
// Errors go to stderr as one line, "fencelock: <message>".
package cli
