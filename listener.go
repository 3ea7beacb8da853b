package fencelock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The lessor's listening connection: one session that LISTENs on the lessor's own channel, so
// that a release that hands a lease to one of this lessor's waits (LeaseRelease) wakes it at
// once, without a poll in between. Only the head of a queue is notified, on its own lessor's
// channel: no herd.
//
// It is opened by the first wait of the lessor that is refused (a lessor that never waits
// never opens it), and closed listenerLinger after the lessor last had a wait or a held lease
// (so a lessor that holds, releases and waits again keeps it). It is a connection taken from
// the pool and hijacked, so the pool's connect hooks apply and its slot is freed.
//
// Where LISTEN cannot work, waits poll as before this queue existed: behind a pooler (the
// backend pid the server reports differs from the one the connection got at startup, as for
// session advisory locks: transaction pooling would lose the LISTEN; session pooling is
// refused too, conservatively), and while the connection is down (terminated, broken): it is
// opened again with backoff, and every wait is woken to poll when it goes down. No wake-up is
// needed for safety: a release hands the lease over in its own statement, and a wait that
// missed its NOTIFY finds the grant at its next poll.

// listenerLinger is how long the listening connection stays open after the lessor last had a
// wait or a held lease.
const listenerLinger = time.Second

// listenProbeTimeout bounds opening the listening connection (connect, pooler check, LISTEN).
const listenProbeTimeout = 5 * time.Second

// errPooled: the listening connection reaches the server through a pooler.
var errPooled = errors.New("fencelock: a pooler sits between client and server (backend pid differs from the startup pid): LISTEN cannot be trusted; waiters poll")

type listener struct {
	channel string // the lessor's NOTIFY channel: "fencelock_" and 16 hex digits

	// Guarded by the lessor's mu.
	running bool               // a listening goroutine runs (or is winding down after cancel)
	cancel  context.CancelFunc // stops it
	ready   bool               // LISTEN is in place on a direct session
	idle    timer              // armed while the lessor has no wait and no lease; closes it
	gen     int                // counts the goroutines started; a stale one's state changes are ignored
}

func newListener() listener {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return listener{channel: "fencelock_" + hex.EncodeToString(b[:])}
}

// listeningChannel returns the lessor's channel while its listening connection is ready, else
// "" (the wait then polls).
func (l *Lessor) listeningChannel() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.listen.ready {
		return l.listen.channel
	}
	return ""
}

// startListeningLocked opens the listening connection if it is not running, and disarms its
// idle close. l.mu must be held.
func (l *Lessor) startListeningLocked() {
	if l.listen.idle != nil {
		l.listen.idle.Stop()
	}
	if l.listen.running {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.listen.gen++
	l.listen.running, l.listen.cancel = true, cancel
	go l.listenLoop(ctx, l.listen.gen)
}

// idleCheckLocked arms the listening connection's close when the lessor has neither a wait
// nor a held lease. l.mu must be held.
func (l *Lessor) idleCheckLocked() {
	if !l.listen.running || len(l.waits) > 0 || len(l.active) > 0 {
		return
	}
	if l.listen.idle == nil {
		l.listen.idle = l.cfg.clock.AfterFunc(listenerLinger, l.closeIfIdle)
	} else {
		l.listen.idle.Reset(listenerLinger)
	}
}

// closeIfIdle closes the listening connection if the lessor still has neither a wait nor a
// held lease.
func (l *Lessor) closeIfIdle() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.listen.running || len(l.waits) > 0 || len(l.active) > 0 {
		return
	}
	l.listen.cancel()
	l.listen.running, l.listen.ready = false, false
}

// setListening records whether LISTEN is in place, and wakes every wait when it went down, so
// that each polls from now on (and, when it is up again, refreshes its row with the channel).
func (l *Lessor) setListening(gen int, ready bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if gen != l.listen.gen || l.listen.ready == ready {
		return
	}
	l.listen.ready = ready
	for _, w := range l.waits {
		w.signalLocked()
	}
}

// listenLoop keeps the listening connection open until ctx ends: on a failure it polls again
// (setListening(false)) and reopens the connection with the lessor's backoff. Behind a pooler it
// gives up for this run: waits poll.
func (l *Lessor) listenLoop(ctx context.Context, gen int) {
	for n := 0; ; n++ {
		err := l.listenSession(ctx, gen)
		l.setListening(gen, false)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errPooled) {
			l.cfg.common.logger.Warn("fencelock: lease waiters poll: "+errPooled.Error(), "holder", l.cfg.holder)
			return
		}
		l.cfg.common.logger.Warn("fencelock: listening connection lost; lease waiters poll until it is back", "holder", l.cfg.holder, "error", err)
		t := time.NewTimer(l.cfg.backoff(n))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// listenSession opens one listening session and dispatches its notifications until it fails
// or ctx ends.
func (l *Lessor) listenSession(ctx context.Context, gen int) error {
	octx, cancel := context.WithTimeout(ctx, listenProbeTimeout)
	defer cancel()
	pc, err := l.pool.Acquire(octx)
	if err != nil {
		return err
	}
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	var pid int32
	if err := conn.QueryRow(octx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return err
	}
	if uint32(pid) != conn.PgConn().PID() {
		return errPooled
	}
	if _, err := conn.Exec(octx, "LISTEN "+pgx.Identifier{l.listen.channel}.Sanitize()); err != nil {
		return err
	}
	l.setListening(gen, true)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if err := l.notified(n.Payload); err != nil {
			l.cfg.common.logger.Error("fencelock: unreadable notification", "holder", l.cfg.holder, "payload", n.Payload, "error", err)
		}
	}
}

// handoff is a grant a release handed to one of this lessor's waits: its token and its expiry
// on the database clock.
type handoff struct {
	token     Token
	expiresAt time.Time
}

// parseWake reads a payload of LeaseRelease: "<wait_id> <token> <expires_at µs> <name>";
// token 0 wakes the wait without a grant (the lease is free: try now).
func parseWake(payload string) (waitID int64, h handoff, name string, err error) {
	f := strings.SplitN(payload, " ", 4)
	if len(f) != 4 {
		return 0, h, "", fmt.Errorf("want 4 fields, got %d", len(f))
	}
	waitID, err1 := strconv.ParseInt(f[0], 10, 64)
	token, err2 := strconv.ParseInt(f[1], 10, 64)
	us, err3 := strconv.ParseInt(f[2], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return 0, h, "", err
	}
	return waitID, handoff{token: Token(token), expiresAt: time.UnixMicro(us)}, f[3], nil
}
