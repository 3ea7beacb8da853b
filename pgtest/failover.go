package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// promoteWait is how long [Server.Promote] lets pg_promote wait for the end of recovery.
const promoteWait = 60 // seconds

// Promote promotes s, a hot standby from [Server.StartStandby], to a primary with
// pg_promote(wait => true), the SQL form of `pg_ctl promote`, and returns once the server has
// left recovery and accepts writes. The promoted server starts a new timeline, numbered above
// every timeline it knows of. From then on s is a primary of its own: [Server.CreateDatabase]
// and [Server.NewDB] work on it, and [Server.WaitReplay] no longer accepts it as a standby.
// The old primary is left as it is: stop it first ([Server.Crash]) to model a failover, or
// leave it running to model a split brain.
//
// The promoted server keeps the settings it has, those its base backup copied from the
// primary's postgresql.auto.conf included: if that set synchronous_standby_names (see
// [Server.SetSynchronousStandbys]), its commits wait for a standby it does not have until
// SetSynchronousStandbys(ctx, "") is called on it. ctx bounds the call (pg_promote itself
// waits at most 60 s). Safe for concurrent use.
//
// Errors: an error if s is not a standby from StartStandby, or if pg_promote returns false
// (recovery did not end within 60 s); connection and SQL errors.
func (s *Server) Promote(ctx context.Context) error {
	if s.primary.Load() == nil {
		return errors.New("pgtest: promote: this server is not a standby from StartStandby")
	}
	conn, err := s.connect(ctx, s.maintDB)
	if err != nil {
		return fmt.Errorf("pgtest: promote: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var promoted bool
	if err := conn.QueryRow(ctx, `SELECT pg_promote(true, $1)`, promoteWait).Scan(&promoted); err != nil {
		return fmt.Errorf("pgtest: promote: %w", err)
	}
	if !promoted {
		return fmt.Errorf("pgtest: promote: pg_promote returned false: recovery did not end within %d s", promoteWait)
	}
	s.primary.Store(nil)
	return nil
}

// senderWait bounds how long PauseWALSenders waits for a WAL sender to appear.
const senderWait = 30 * time.Second

// walSenders returns the pids of s's WAL senders, as pg_stat_replication lists them on conn.
func walSenders(ctx context.Context, conn *pgx.Conn) ([]int, error) {
	rows, err := conn.Query(ctx, `SELECT pid FROM pg_stat_replication WHERE pid IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	var pids []int
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, int(pid))
	}
	return pids, rows.Err()
}

// PauseWALSenders stops every WAL sender process of s (SIGSTOP to each pid that
// pg_stat_replication lists) and returns how many it stopped. Its standbys then receive
// nothing more: WAL that s writes from then on exists only on s, which is how a failover of
// an asynchronous standby loses committed transactions. With a synchronous standby, commits
// on s wait until [Server.ResumeWALSenders]. [Server.Crash] and [Server.Close] kill (SIGKILL)
// the paused senders after the postmaster's immediate shutdown has begun, so a crash of s
// sends them nothing more either. The pids are those of the moment of the call: a standby
// that connects later gets a running sender. A sender stopped while it holds a spinlock would
// stall every commit on s: after stopping them, PauseWALSenders commits a probe transaction
// (synchronous_commit = local, at most 2 s), and if it does not go through it resumes the
// senders and stops them again, up to 5 times. Safe for concurrent use.
//
// Errors: one wrapping [errors.ErrUnsupported] unless s runs from local binaries; an error if
// s is closed or not running, or has had no WAL sender for 30 s (a standby that was just
// started is waited for until its sender appears); one if commits stayed stuck 5 times (the
// senders are then running); connection, SQL and signal errors.
func (s *Server) PauseWALSenders(ctx context.Context) (int, error) {
	if s.kind != kindLocal {
		return 0, fmt.Errorf("pgtest: PauseWALSenders needs a server started from local binaries, this is %s: %w", s.kind, errors.ErrUnsupported)
	}
	conn, err := s.connect(ctx, s.maintDB)
	if err != nil {
		return 0, fmt.Errorf("pgtest: pause WAL senders: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// A standby that StartStandby returned accepts connections, but its WAL receiver may not
	// have reached s yet (on a loaded machine, seconds later): wait for a sender to appear.
	var pids []int
	deadline, pause := time.Now().Add(senderWait), 5*time.Millisecond
	for {
		pids, err = walSenders(ctx, conn)
		if err != nil {
			return 0, fmt.Errorf("pgtest: pause WAL senders: %w", err)
		}
		if len(pids) > 0 {
			break
		}
		if !time.Now().Before(deadline) {
			return 0, fmt.Errorf("pgtest: pause WAL senders: pg_stat_replication listed no WAL sender for %v (no standby streaming)", senderWait)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("pgtest: pause WAL senders: waiting for a WAL sender: %w", context.Cause(ctx))
		case <-time.After(pause):
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
	// A sender stopped while it held a spinlock (it takes XLogCtl's info_lck on every loop)
	// would leave every backend that writes WAL spinning until PostgreSQL PANICs with "stuck
	// spinlock". Rare, but a test would hang: so check that a local commit still goes
	// through, and if it does not, resume the senders and stop them again.
	for attempt := 1; ; attempt++ {
		if err := s.local.PauseWALSenders(pids); err != nil {
			return 0, err
		}
		err := s.probeLocalCommit(ctx)
		if err == nil {
			return len(pids), nil
		}
		if rerr := s.local.ResumeWALSenders(); rerr != nil {
			return 0, errors.Join(err, rerr)
		}
		if attempt == pauseAttempts || ctx.Err() != nil {
			return 0, fmt.Errorf("pgtest: pause WAL senders: commits stopped while the senders were paused, %d times: %w", attempt, err)
		}
	}
}

// pauseAttempts bounds how often [Server.PauseWALSenders] stops the senders again after its
// probe found commits stuck; probeTimeout bounds the probe.
const (
	pauseAttempts = 5
	probeTimeout  = 2 * time.Second
)

// probeLocalCommit commits a transaction with an xid on s with synchronous_commit = local (it
// waits for the local flush, not for a standby), within probeTimeout.
func (s *Server) probeLocalCommit(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	conn, err := s.connect(ctx, s.maintDB)
	if err != nil {
		return fmt.Errorf("probe commit: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, `BEGIN; SET LOCAL synchronous_commit = local; SELECT txid_current(); COMMIT`); err != nil {
		return fmt.Errorf("probe commit: %w", err)
	}
	return nil
}

// ResumeWALSenders resumes (SIGCONT) the WAL senders that [Server.PauseWALSenders] stopped;
// the standbys catch up from where they were. It does nothing when none is paused. Safe for
// concurrent use. Errors: one wrapping [errors.ErrUnsupported] unless s runs from local
// binaries; a signal error.
func (s *Server) ResumeWALSenders() error {
	if s.kind != kindLocal {
		return fmt.Errorf("pgtest: ResumeWALSenders needs a server started from local binaries, this is %s: %w", s.kind, errors.ErrUnsupported)
	}
	return s.local.ResumeWALSenders()
}

// syncStandbyTimeout bounds how long [Server.SetSynchronousStandbys] waits for a synchronous
// standby to be chosen.
const syncStandbyTimeout = 30 * time.Second

// SetSynchronousStandbys sets synchronous_standby_names on s, a primary, with ALTER SYSTEM
// and a configuration reload, and waits until it is in force: with names "" (asynchronous
// replication), until the setting reads empty; otherwise (for example "*": any one standby)
// until pg_stat_replication shows a standby in sync state "sync" or "quorum", so that every
// commit from then on waits until a standby has flushed its WAL (with synchronous_commit on,
// the default), polling every 50 ms from fresh sessions. It waits at most 30 s, less if ctx
// ends first. ALTER SYSTEM writes postgresql.auto.conf, which a base backup copies: a standby
// started later inherits the setting (see [Server.Promote]). Safe for concurrent use.
//
// Errors: an error if s is a standby; one if synchronous_standby_names was set on the command
// line ([WithSetting]), which ALTER SYSTEM cannot override; on timeout, one wrapping
// [context.DeadlineExceeded] and the last connection or SQL error; connection and SQL
// errors of the ALTER SYSTEM.
func (s *Server) SetSynchronousStandbys(ctx context.Context, names string) error {
	if s.primary.Load() != nil {
		return errors.New("pgtest: set synchronous standbys: this server is a standby")
	}
	ctx, cancel := context.WithTimeout(ctx, syncStandbyTimeout)
	defer cancel()
	conn, err := s.connect(ctx, s.maintDB)
	if err != nil {
		return fmt.Errorf("pgtest: set synchronous standbys: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var source, stmt string
	if err := conn.QueryRow(ctx, `SELECT source, format('ALTER SYSTEM SET synchronous_standby_names = %L', $1::text)
		FROM pg_settings WHERE name = 'synchronous_standby_names'`, names).Scan(&source, &stmt); err != nil {
		return fmt.Errorf("pgtest: set synchronous standbys: %w", err)
	}
	if source == "command line" {
		return errors.New("pgtest: set synchronous standbys: synchronous_standby_names was set on the command line (WithSetting), which ALTER SYSTEM cannot override")
	}
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("pgtest: set synchronous standbys: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return fmt.Errorf("pgtest: set synchronous standbys: %w", err)
	}
	// The postmaster rereads the files on SIGHUP and each process on its own a moment later:
	// poll from fresh sessions until one sees the value.
	q := `SELECT current_setting('synchronous_standby_names') = $1 AND
		($1 = '' OR EXISTS (SELECT FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')))`
	return poll(ctx, fmt.Sprintf("set synchronous standbys to %q: not in force (no synchronous standby?)", names), func() (bool, error) {
		var done bool
		c, err := s.connect(ctx, s.maintDB)
		if err == nil {
			err = c.QueryRow(ctx, q, names).Scan(&done)
			c.Close(context.WithoutCancel(ctx))
		}
		return done, err
	})
}

// ClusterURL returns one connection string for database on all of servers, a primary and its
// standbys: a multi-host postgres:// URL with target_session_attrs=read-write, so that a
// client (pgx, libpq) tries the hosts in order and keeps the first that accepts writes. A pool
// made from it follows the primary across [Server.Promote]: connections to the old primary
// break, and new ones go to whichever server is the read-write one. connect_timeout=5 bounds
// each host's attempt. The servers must share the superuser and password (as those of one
// [Start] kind do). pgx (like libpq) stops at the first host that answers "database does not
// exist" (SQLSTATE 3D000) instead of trying the next: list the primary first, or wait until
// the standbys listed before it have replayed the database's creation ([Server.WaitReplay]).
//
// Errors: an error if servers is empty, if one is nil or is the server of
// FENCELOCK_TEST_DATABASE_URL (no URL form), or if their users differ.
func ClusterURL(database string, servers ...*Server) (string, error) {
	if len(servers) == 0 {
		return "", errors.New("pgtest: cluster URL: no servers")
	}
	var hosts []string
	var user *url.Userinfo
	for i, s := range servers {
		if s == nil || s.base == nil {
			return "", fmt.Errorf("pgtest: cluster URL: server %d has no URL form (nil, or an existing keyword/value server)", i)
		}
		if i == 0 {
			user = s.base.User
		} else if s.base.User.String() != user.String() {
			return "", errors.New("pgtest: cluster URL: the servers' users differ")
		}
		hosts = append(hosts, s.base.Host)
	}
	u := *servers[0].base
	u.Host = strings.Join(hosts, ",")
	u.Path = "/" + database
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	q.Set("connect_timeout", "5")
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// WALArchive returns the directory of the WAL archive that [WALArchive] gave s or, for a
// standby, its primary; "" when there is none. The archive lives in the primary's temp dir:
// closing the primary removes it. Safe for concurrent use.
func (s *Server) WALArchive() string {
	if s.kind != kindLocal {
		return ""
	}
	return s.local.ArchiveDir()
}
