// Package integration holds the tests of package fencelock that need more than the root
// package's own tests can have: PgBouncer, Patroni, standbys, failovers and crashes (pgtest's
// servers), goroutine-leak checks (goleak), the OpenTelemetry SDK, the peers of the
// benchmarks (pglock, redis), the command's tests and the benchmarks. Tests of the public API
// that need only a server live beside the code, on internal/pgserver's shared server: in the
// root package (advisory locks and Migrate among them), in ratelimit, job, gooselock (goose's
// locktesting suite among them; its runs behind PgBouncer stay here) and migrations (the head
// schema's check); and so do the tests that drive the root package's unexported internals
// (its internal tests, package fencelock, where the compiler checks every access).
//
// It is a module of its own (github.com/fencelock/fencelock/internal/integration), so that the
// test harness it needs (pgtest, with testcontainers-go) stays out of the requirements of the
// fencelock module that users import; the workspace at the repository's root (go.work) runs
// it with every other test:
//
//	go test -race github.com/fencelock/fencelock/...
package integration
