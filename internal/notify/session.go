package notify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The notifier's session: the goroutine that keeps its listening connection open and reads
// its notifications.

// run keeps the listening connection open until ctx ends: on a failure subscribers poll
// (setReady(false)) and it opens the connection again after a backoff. Behind a pooler it
// gives up: subscribers poll until the notifier retires.
func (n *notifier) run(ctx context.Context) {
	for attempt := 0; ; attempt++ {
		listened, err := n.session(ctx)
		n.setReady(ctx, false)
		if listened {
			attempt = 0 // a new streak of failures: say it again, and retry soon
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, ErrPooled) {
			n.logger.Warn("fencelock: " + ErrPooled.Error())
			return
		}
		if attempt == 0 {
			n.logger.Warn("fencelock: listening connection lost; lease waiters poll until it is back", "error", err)
		}
		t := time.NewTimer(n.backoff(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// session opens one listening session and dispatches its notifications until it fails or ctx
// ends.
func (n *notifier) session(ctx context.Context) (listened bool, err error) {
	conn, err := openListening(ctx, n.pool, n.channel)
	if err != nil {
		return false, err
	}
	defer closeListening(conn)
	n.setReady(ctx, true)
	for {
		// A read that waits longer than probeAfter is cut short to probe the connection: a
		// half-open TCP flow (a NAT or firewall that dropped the idle flow, a vanished peer)
		// never returns an error, and its notifications would be lost in silence. pgx keeps
		// the connection usable after a read deadline (a timeout does not close it).
		wctx, cancel := context.WithTimeout(ctx, probeAfter)
		nt, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			n.dispatch(nt.Channel, nt.Payload)
			continue
		case ctx.Err() != nil:
			return true, ctx.Err()
		case !errors.Is(err, context.DeadlineExceeded) && !pgconn.Timeout(err):
			return true, err
		}
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err = conn.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return true, ctx.Err()
			}
			// Dead: close its socket now. pgx, which gave up on the connection at the probe's
			// deadline, would otherwise drain it for up to 15 s before closing it.
			_ = conn.PgConn().Conn().Close()
			return true, fmt.Errorf("listening connection did not answer a probe within %v: %w", probeTimeout, err)
		}
	}
}

// openListening takes a connection of pool out of it (hijacked: it never goes back) and,
// unless a pooler answers for the server (ErrPooled: the backend pid differs from the startup
// pid), LISTENs on channel and on ElectionChannel, with idle_session_timeout off (an older
// server refuses the setting, which is then moot). The caller closes the connection with
// closeListening. Bounded by openTimeout.
func openListening(ctx context.Context, pool *pgxpool.Pool, channel string) (*pgx.Conn, error) {
	octx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	pc, err := pool.Acquire(octx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack()
	var pid int32
	if err := conn.QueryRow(octx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		closeListening(conn)
		return nil, err
	}
	if uint32(pid) != conn.PgConn().PID() {
		closeListening(conn)
		return nil, ErrPooled
	}
	_, _ = conn.Exec(octx, "SET idle_session_timeout = 0")
	listen := "LISTEN " + pgx.Identifier{channel}.Sanitize() + "; LISTEN " + pgx.Identifier{ElectionChannel}.Sanitize()
	if _, err := conn.Exec(octx, listen); err != nil {
		closeListening(conn)
		return nil, err
	}
	return conn, nil
}

// closeListening closes a connection of openListening, bounded by closeTimeout.
func closeListening(conn *pgx.Conn) {
	cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = conn.Close(cctx)
}
