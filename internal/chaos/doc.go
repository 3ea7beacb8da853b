// Package chaos drives fencelock's leases, advisory locks and fences through real workloads
// against a real PostgreSQL (from package pgtest), injects faults, records a history of every
// operation and checks it: for linearizability of a fenced register with porcupine, and for a
// set of direct invariants, each a function of the history.
//
// # Design
//
// A scenario starts workers, each of which takes a lock (a lease or an advisory lock with a
// fencing token) and makes fenced writes. Every operation is recorded twice in a [Recorder]:
// when it is invoked and when its result is known, as [OK], [Fail] (definitely did not happen)
// or [Unknown] (may have happened: a connection broke during the commit, a process died).
//
//	workers ──ops──▶ Recorder ──History──▶ CheckLinearizable (porcupine)
//	   ▲                                  └▶ invariants (tokens, lost writes, trust window, ...)
//	   └──── Fault (pause, kill, terminate backend, crash server, proxy toxics, timeouts, ...)
//
// The ledger of the fenced register is an append-only array column: its final value is the
// commit order, against which porcupine checks that acknowledged writes, rejected stale
// writes and unknown outcomes can be explained by one sequential order consistent with
// real time. The approach is Jepsen's (Kingsbury), with the linearizability checker of
// Athalye's porcupine; the fencing scheme under test is Kleppmann's (2016).
//
// FENCELOCK_CHAOS_RUNS=n runs every scenario n times instead of its short default.
// FENCELOCK_SOAK=<duration> (e.g. 10m) makes TestSoak run the register workload under a random
// mix of faults (latency, blackholes and resets through an in-process toxiproxy,
// pg_terminate_backend, idle-in-transaction timeouts) for that long; unset, TestSoak returns
// at once and checks nothing.
package chaos
