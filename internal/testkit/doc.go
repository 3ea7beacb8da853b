// Package testkit holds the helpers that the tests of this repository's packages share, so
// that each exists once: a context bounded for a test, pools closed at test cleanup, waits
// that poll something observable within a bound (never a bare sleep), and reads of
// fencelock's tables and views and of pg_locks and pg_stat_activity, limited to the test's
// own database.
//
// It is imported by tests only, and never imports the library: package fencelock's internal
// tests use it too. The helpers that drive the library's API (lessors, elections, semaphores,
// advisory lockers, fencing tokens) are in [github.com/fencelock/fencelock/internal/testkit/fencetest].
//
// [Setup] gives a test package its setup(t): a [Bundle] on pgserver's shared server.
//
// A test package keeps its own short names for these (setup, newPool, readQueue, awaitQueue,
// waitFor, ...), each a one-line alias or wrapper, so that its tests read as before.
//
// # Waits
//
// Every wait here polls a state the test can observe (a view, pg_locks, a condition the caller
// gives) and fails the test when its bound passes: [WaitFor] until a context ends, [AwaitQueue]
// and [AwaitWaiters] for 10 s, [Receive] for the limit given.
package testkit
