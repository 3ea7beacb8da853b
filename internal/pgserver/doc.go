// Package pgserver gives tests a real PostgreSQL server without Docker: it finds the server
// binaries (initdb, postgres) of a local installation, runs a throwaway cluster of them on a
// free port of 127.0.0.1 (as an unprivileged user when the test runs as root), and makes each
// test a fresh database cloned from a template migrated with fencelock's migrations.
//
// # Two users
//
// The root package's own tests (package fencelock and fencelock_test) call [Main] from
// TestMain and [NewDB] from each test: one server per test process, shared by every test,
// or the existing server of FENCELOCK_TEST_DATABASE_URL. Module
// github.com/fencelock/fencelock/pgtest builds its local servers, standbys, PgBouncer and
// Patroni clusters on the process helpers here ([StartLocal], [StartRun], [Command],
// [WaitAccepting], [Cloner]).
//
// # No import of the library
//
// pgserver never imports package fencelock: the root package's internal tests could not use
// it then (an import cycle). The migrations come in as a [MigrateFunc], which callers set to
// fencelock.Migrate.
//
// pgserver needs nothing beyond the root module's own requirements (pgx, the standard
// library), so the library's consumers download nothing for it.
package pgserver
