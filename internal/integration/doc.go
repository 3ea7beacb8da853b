// Package integration holds the tests of package fencelock that need a real PostgreSQL:
// leases, advisory locks, fencing, migrations, the fault tests of single mechanisms, the
// benchmarks and the runnable examples. It is a module of its own
// (github.com/fencelock/fencelock/internal/integration), so that the test harness it needs
// (pgtest, with testcontainers-go) stays out of the requirements of the fencelock module that
// users import; the workspace at the repository's root (go.work) runs it with every other test:
//
//	go test -race github.com/fencelock/fencelock/...
//
// It reaches the few internals a test must drive through internal/testhook.
package integration
