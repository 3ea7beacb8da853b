// Command fencelock shows and manages the locks that package fencelock keeps in a
// PostgreSQL database: held leases with their fencing tokens, TTLs, heartbeats and queues,
// advisory locks with the backends that hold or await them, and fencing high-water marks.
//
//	go install github.com/fencelock/fencelock/cmd/fencelock@latest
//	export DATABASE_URL=postgres://app@db.internal/payments
//
// # Commands
//
//	fencelock migrate                   apply fencelock's migrations, print the schema version
//	fencelock locks [--name PATTERN]    held leases and advisory locks
//	fencelock watch [--interval 1s]     the same table, redrawn until q, ctrl-C or SIGTERM
//	fencelock fences [--name PATTERN]   high-water marks, with the holder of the same lease
//	fencelock release --force NAME [--fence RESOURCE]... [--token T] [--lock-timeout 5s]
//	fencelock release --force --advisory NAME|KEY [--yes]
//	fencelock sweep [--grace 1h]        delete lease rows expired longer than the grace period
//	fencelock ui [--listen 127.0.0.1:8080] [--allow-release]
//	                                    the live view in the browser (package ui)
//	fencelock version                   the version, the revision it was built from, the Go version
//	fencelock help [COMMAND]
//
// Every command takes --database-url (default: the environment variable DATABASE_URL) and
// --json (one JSON document; for watch, one array per refresh, one a line).
//
// # Version
//
// fencelock version (or fencelock --version) prints the version of the fencelock module the
// binary was built from, as its build information records it, and the Go version:
//
//	$ go install github.com/fencelock/fencelock/cmd/fencelock@v0.1.0
//	$ fencelock version
//	fencelock v0.1.0 (go1.26.8 linux/amd64)
//
// A binary built from a source tree says "(devel)", or the pseudo-version the go command
// derived from the checkout, then the VCS revision and its commit time when the go command
// recorded them (not with -buildvcs=false), and "modified" when the tree had uncommitted
// changes:
//
//	fencelock v0.0.0-20261126184000-00d5874a1b2c+dirty, revision 00d5874a1b2c3d4e5f60718293a4b5c6d7e8f901 of 2026-11-26T18:40:00Z, modified (go1.26.8 linux/amd64)
//
// # The lock table
//
//	$ fencelock locks
//	KIND      RESOURCE        HOLDER                 TOKEN            TTL LEFT  HEARTBEAT        HELD FOR  WAITERS
//	lease     payment:42      worker-1               140737488355329  8.1s      ok (3 renewals)  9.4s      1 (next: worker-2)
//	lease     report:daily    cron-7                 140737488355330  4m51s     ok (0 renewals)  9.4s      0
//	advisory  key 1,2         pid 28943 (127.0.0.1)  -                -         session          1.8s      0
//	advisory  key 4242        pid 28944 (127.0.0.1)  -                -         session          1.8s      1
//	advisory  key 77          pid 28953              -                -         session          1.3s      0
//	advisory  nightly-report  pid 28873 (127.0.0.1)  -                -         session          -         0
//
// Leases come from the view fencelock.holders: HEARTBEAT is "late" once the last renewal (or
// the grant) is older than half the TTL, a sign of a paused or partitioned holder. Advisory
// locks come from fencelock.advisory_locks: RESOURCE is the lock's name when a fencelock
// session holds it and has been labelled with it, else its key (a session is labelled at its
// locker's first watchdog probe of the lock, within one watchdog interval of the grant, 5 s by
// default: a lock held for less shows by key, and --name does not match it by name); HELD FOR
// is the age of the holder's open transaction, "-" when it is idle; WAITERS counts the
// backends waiting for the same key.
//
// # Releasing someone else's lock
//
// release --force NAME ends the current grant of lease NAME, whoever holds it, by
// fencelock.force_release: the lease goes to the head of its queue with a fresh token (or stays
// free; a semaphore's permit, "S#i", goes to the head of the semaphore's queue as its holder's
// release would give it, or is freed with that head told to take it, and the output says
// "handed to" or "woke the head of the queue"), and the high-water mark of NAME and of each --fence RESOURCE is raised to that token,
// so the old holder's fenced writes are rejected when it wakes up:
//
//	$ fencelock release --force payment:42 --fence ledger:42
//	released lease "payment:42" held by worker-1 (token 140737488355329); fenced with token 140737488355332 (payment:42, ledger:42); handed to worker-2
//
// With --token T it ends only the grant with token T (as locks showed it), or fences T out if
// that grant has lapsed meanwhile, and changes nothing (exit 3) when a newer grant replaced it.
// A holder inside a guarded transaction (Lease.GuardTx, Lease.FenceTx) or a RunLocked holds
// the lease row until that transaction ends; release waits at most --lock-timeout for it and
// then exits with code 4, naming the blocking backends (pg_blocking_pids). release --force --advisory
// terminates the backends holding an advisory lock (by name, int64 key or "K1,K2" pair), after
// asking on the terminal unless --yes.
//
// # The live view
//
// fencelock ui serves package ui's live view until ctrl-C or SIGTERM: pages of leases,
// advisory locks, semaphores, elections, jobs, fences and rate limits that follow the database
// through server-sent events, and a page per lease name with its queue and the timeline of its
// holders. It listens on 127.0.0.1:8080 unless --listen says otherwise, polls every --interval
// (500ms) whether a page is open or not, keeps --window (10m) of timeline, and reads through
// connections whose transactions are all read-only (through a pooler that refuses the startup
// parameter default_transaction_read_only, such as PgBouncer, it warns and relies on the role). With --allow-release, a page offers forced
// releases (fencelock release --force NAME --token T, after a confirmation) to requests that
// carry the access token in FENCELOCK_UI_SECRET (at least 16 bytes; as a bearer token, or the
// password of basic authentication), run on --release-database-url (default: the same URL).
//
// # Exit codes
//
//	0  ok
//	1  an error: the database refused or could not be reached, output could not be written,
//	   a terminated backend did not exit, a lock held by a prepared transaction, or declined
//	   at the prompt
//	2  usage error: unknown command or flag, missing argument, no database URL
//	3  nothing to do: no holder found (release --advisory), or the last grant is not the one
//	   --token names (release; nothing changed)
//	4  the lease row is locked by a transaction: lock timeout (release --lock-timeout), or a
//	   deadlock with a holder that fenced before it guarded (retry)
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/fencelock/fencelock/internal/cli"
)

func main() {
	// SIGHUP and SIGQUIT too: watch restores the terminal on its way out, which a process
	// killed by the default action of a signal would not do.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	code := cli.Run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
