// Package pgtest gives tests (and examples, as an "embedded" Postgres) a real PostgreSQL
// server: a fresh database per test, cloned from a template migrated with
// [github.com/fencelock/fencelock.Migrate], and dedicated servers that fault tests may crash
// and restart.
//
// It is a module of its own, github.com/fencelock/fencelock/pgtest, so that its dependencies
// (testcontainers-go and the Docker client) stay out of the requirements of the fencelock
// module: a service that imports fencelock does not get them; its tests get them with
// go get github.com/fencelock/fencelock/pgtest.
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		db := pgtest.NewDB(t) // db.Pool, db.URL: schema fencelock is there
//		...
//	}
//
// # Finding a server
//
// [NewDB] uses one server per test binary, the first of:
//
//  1. FENCELOCK_TEST_DATABASE_URL: an existing server (a postgres:// URL or a keyword/value
//     string). Its role needs CREATEDB: every test gets its own database there, and a role
//     that cannot create databases fails the test with a message saying so (fencelock's
//     schema has a fixed name and advisory lock keys are per database, so tests cannot share
//     one database safely). pgtest never stops that server.
//  2. A server started by [Start] at the first NewDB and stopped by [Main].
//
// [Start] (and [NewServer], which calls it) always starts a new server, the first of:
//
//  1. A Docker daemon, if DOCKER_HOST is set or a Docker socket exists at a default path
//     and the daemon answers a ping within 5 s: a postgres:15 container through
//     testcontainers-go's postgres module (no crash or restart).
//  2. Local server binaries (initdb, postgres) from the directory in PG_BIN, else from PATH,
//     else the newest /usr/lib/postgresql/<version>/bin (Debian and Ubuntu, where
//     apt-get install postgresql puts them off PATH) or /usr/pgsql-<version>/bin (RHEL).
//     One initdb per process makes a pristine cluster; each server runs on a copy of it in
//     its own temp dir, on 127.0.0.1 and a free port, with trust authentication for user
//     postgres. As root, the servers run as user postgres (or nobody), since initdb and
//     postgres refuse to run as root. On Linux the kernel kills a server (SIGKILL) whose
//     test binary died, so none outlives it; its temp dir is then left behind.
//
// FENCELOCK_TEST_SERVER=docker or =local forces one of the two (a fault test that crashes
// its server needs local binaries, even on a machine with Docker).
//
// # Hot standby and PgBouncer
//
// [Server.NewStandby] (or [Server.StartStandby]) starts a streaming hot standby of a local
// server, from a pg_basebackup of it; [Server.WaitReplay] waits until the standby has replayed
// what the primary committed. [Server.Promote] promotes a standby, [Server.PauseWALSenders]
// holds its primary's WAL back (lag, for failovers that lose commits),
// [Server.SetSynchronousStandbys] makes replication synchronous, [WALArchive] gives a primary
// and its standbys a shared WAL archive, and [ClusterURL] gives one
// multi-host URL (target_session_attrs=read-write) whose pools follow the promotion.
// [NewPatroni] (or [StartPatroni]) runs the cluster users run in production: Patroni members
// with etcd as their store, on loopback, with [PatroniCluster.Switchover] and
// [PatroniCluster.KillLeader] (automatic failover); it needs patroni and etcd (apt-get
// install patroni etcd-server) and fails the test without them.
// [NewPgBouncer] (or [StartPgBouncer]) puts PgBouncer, in session,
// transaction or statement pool mode, in front of a server; it needs the pgbouncer binary
// (apt-get install pgbouncer) and fails the test without it.
//
// # Skipping
//
// With go test -short, NewDB, NewServer, NewStandby, NewPatroni and NewPgBouncer skip the test ("needs
// PostgreSQL"), and [Main] skips the package's examples, which cannot skip themselves.
// Otherwise they never skip: when no server (or no pgbouncer) can be had they fail the test,
// saying why, so that CI cannot count an untested package as passing.
//
// # Requirements
//
// PostgreSQL 13 or later (DROP DATABASE ... WITH (FORCE)); 14 or later for
// [Server.TerminateBackend] to wait until the backend has exited.
package pgtest
