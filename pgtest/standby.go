package pgtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// replayTimeout bounds [Server.WaitReplay] when its ctx has no earlier deadline.
const replayTimeout = time.Minute

// StartStandby starts a hot standby of s, a server started from local binaries, and returns
// it once it accepts connections and reports pg_is_in_recovery() = true. The standby is a
// base backup of s taken by `pg_basebackup -R -X stream` (as the user the server runs as),
// streaming from s without a replication slot, run by the postgres next to s's binaries on
// 127.0.0.1 and a free port, with s's settings (a standby needs max_connections and the like
// at least as high as its primary's) and hot_standby on (PostgreSQL's default).
//
// Everything committed on s before StartStandby is visible on the standby when it returns, the
// databases made by [Server.CreateDatabase] and [Server.NewDB] included; for later commits,
// call [Server.WaitReplay]. The standby is read-only: writes fail with SQLSTATE 25006
// (read_only_sql_transaction), and its CreateDatabase and NewDB fail. [Server.Crash] and
// [Server.Restart] work on it (it restarts as a standby). The caller must [Server.Close] the
// standby, which stops it and removes its data directory; closing s does not close it. On
// Linux the standby is killed (SIGKILL) if the test binary dies. ctx bounds the base backup
// and the start (the start at most one minute). Safe for concurrent use.
//
// Errors: one wrapping [errors.ErrUnsupported] unless [Server.CanCrash] (a container or an
// existing server); an error if s is closed or crashed, or is itself a standby; pg_basebackup's
// error with its output (for example when s runs with wal_level=minimal); the standby's start
// error with the tail of its log.
func (s *Server) StartStandby(ctx context.Context) (*Server, error) {
	if s.kind != kindLocal {
		return nil, fmt.Errorf("pgtest: StartStandby needs a server started from local binaries, this is %s: %w", s.kind, errors.ErrUnsupported)
	}
	if s.primary.Load() != nil {
		return nil, errors.New("pgtest: start standby: this server is itself a standby; start standbys of its primary instead")
	}
	if !s.running() {
		return nil, errors.New("pgtest: start standby: the primary is closed or not running")
	}
	l, base, err := s.local.StartStandby(ctx, s.base)
	if err != nil {
		return nil, err
	}
	standby := &Server{kind: kindLocal, base: base, maintDB: s.maintDB, tplName: s.tplName, local: l}
	standby.primary.Store(s)
	if err := standby.checkInRecovery(ctx); err != nil {
		return nil, errors.Join(err, standby.Close())
	}
	return standby, nil
}

// checkInRecovery returns an error unless the server reports pg_is_in_recovery() = true.
func (s *Server) checkInRecovery(ctx context.Context) error {
	conn, err := s.connect(ctx, s.maintDB)
	if err != nil {
		return fmt.Errorf("pgtest: start standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var inRecovery bool
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil {
		return fmt.Errorf("pgtest: start standby: %w", err)
	}
	if !inRecovery {
		return errors.New("pgtest: start standby: the new server is not in recovery (no standby.signal?)")
	}
	return nil
}

// NewStandby starts a hot standby of s with [Server.StartStandby] and closes it at test
// cleanup (before s, if s came from [NewServer] earlier in the test). Create the test's
// databases on s before calling it, or call [Server.WaitReplay] after creating them.
//
// With go test -short it calls t.Skip("needs PostgreSQL"); otherwise a start error fails the
// test with t.Fatal.
func (s *Server) NewStandby(t testing.TB) *Server {
	t.Helper()
	return startOrSkip(t, serverStartTimeout, s.StartStandby, (*Server).Close)
}

// WaitReplay waits until standby, a standby of s from [Server.StartStandby], has replayed all
// WAL that s had written when WaitReplay was called, so that every transaction committed on s
// before the call (databases created with [Server.CreateDatabase] included) is visible on
// standby. It first commits an empty transaction on s with synchronous_commit = on, which
// flushes the WAL of earlier commits made with synchronous_commit = off, then polls standby's
// pg_last_wal_replay_lsn(), backing off from 5 ms to 100 ms. It waits at most one minute, less
// if ctx ends first. Safe for concurrent use.
//
// Errors: an error if standby is nil or not a standby of s; connection and SQL errors; one
// saying standby has left recovery (was promoted); on timeout, one wrapping
// [context.DeadlineExceeded] (or ctx's error) with the LSNs reached.
func (s *Server) WaitReplay(ctx context.Context, standby *Server) error {
	if standby == nil || standby.primary.Load() != s {
		return errors.New("pgtest: wait replay: the server passed is not a standby of this server")
	}
	ctx, cancel := context.WithTimeout(ctx, replayTimeout)
	defer cancel()

	primary, err := s.connect(ctx, s.maintDB)
	if err != nil {
		return fmt.Errorf("pgtest: wait replay: primary: %w", err)
	}
	defer primary.Close(context.WithoutCancel(ctx))
	var target string
	_, err = primary.Exec(ctx, `SET synchronous_commit = on`)
	if err == nil {
		_, err = primary.Exec(ctx, `SELECT txid_current()`) // a commit record, flushed with all WAL before it
	}
	if err == nil {
		err = primary.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&target)
	}
	if err != nil {
		return fmt.Errorf("pgtest: wait replay: primary: %w", err)
	}

	conn, err := standby.connect(ctx, standby.maintDB)
	if err != nil {
		return fmt.Errorf("pgtest: wait replay: standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return pollReplay(ctx, conn, target)
}

// pollReplay polls the standby behind conn until it has replayed WAL up to target (a pg_lsn
// in text form) or ctx ends.
func pollReplay(ctx context.Context, conn *pgx.Conn, target string) error {
	const q = `SELECT pg_is_in_recovery(), coalesce(pg_last_wal_replay_lsn()::text, ''),
		coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)`
	delay := 5 * time.Millisecond
	for {
		var inRecovery, done bool
		var replayed string
		if err := conn.QueryRow(ctx, q, target).Scan(&inRecovery, &replayed, &done); err != nil {
			return fmt.Errorf("pgtest: wait replay: standby: %w", err)
		}
		switch {
		case !inRecovery:
			return errors.New("pgtest: wait replay: the standby is no longer in recovery (promoted)")
		case done:
			return nil
		}
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("pgtest: wait replay: standby replayed up to %s, primary is at %s: %w", replayed, target, ctx.Err())
		case <-timer.C:
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}
