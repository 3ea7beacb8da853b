package fencelock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The listening connection: one session per pool that LISTENs on a channel of its own, so that
// a release that hands a lease to a wait of one of the pool's lessors (LeaseRelease) wakes that
// wait at once, without a poll in between. Only the head of a queue is notified, on the
// channel of its own process's pool: no herd of waiters. (PostgreSQL's notify queue is one per
// database: each NOTIFY signals every listening session of the database, which reads the queue
// in a short read-only transaction. One session per pool, not per waiter or lessor, keeps that
// to one per process.)
//
// A lessor attaches to its pool's listener at its first refused wait (a lessor that never waits
// never opens one) and detaches listenerLinger after it last had a wait or a held lease (so a
// lessor that holds, releases and waits again keeps it); the connection closes when its last
// lessor detaches. It is a connection taken from the pool and hijacked, so the pool's connect
// hooks apply and the pool's slot is freed.
//
// Where LISTEN cannot work, waits poll as before this queue existed: behind a pooler (the
// backend pid the server reports differs from the one the connection got at startup, as for
// session advisory locks: transaction pooling would lose the LISTEN; session pooling is
// treated the same, conservatively), and while the connection is down (terminated, broken):
// it is opened again with backoff, and every wait is woken to poll when it goes down. No
// wake-up is needed for safety: a release hands the lease over in its own statement, and a
// wait that missed its NOTIFY finds the grant at its next poll.

// listenerLinger is how long a lessor stays attached to its pool's listening connection after
// it last had a wait or a held lease.
const listenerLinger = time.Second

// listenOpenTimeout bounds opening the listening connection (connect, pooler check, LISTEN).
const listenOpenTimeout = 5 * time.Second

// listenBackoff paces attempts to open the listening connection again.
var listenBackoff = ExponentialBackoff(10*time.Millisecond, time.Second)

// errPooled: the listening connection reaches the server through a pooler.
var errPooled = errors.New("a pooler sits between client and server (backend pid differs from the startup pid): LISTEN cannot be trusted; lease waiters poll")

// listener is the listening connection of one pool, shared by the pool's lessors.
type listener struct {
	pool    *pgxpool.Pool
	channel string // "fencelock_" and 16 hex digits

	mu      sync.Mutex
	lessors map[string]*Lessor // attached, by holder id
	ready   bool               // LISTEN is in place on a direct session
	cancel  context.CancelFunc // stops the goroutine
	logger  *slog.Logger       // the first attached lessor's
}

// listeners holds the listener of each pool that has attached lessors.
var listeners = struct {
	sync.Mutex
	byPool map[*pgxpool.Pool]*listener
}{byPool: make(map[*pgxpool.Pool]*listener)}

// attachListenerLocked attaches l to its pool's listener, opening it when l is the first, and
// disarms l's detach. l.mu must be held.
func (l *Lessor) attachListenerLocked() {
	if l.lingering != nil {
		l.lingering.Stop()
	}
	if l.listener != nil {
		return
	}
	listeners.Lock()
	defer listeners.Unlock()
	ls := listeners.byPool[l.pool]
	if ls == nil {
		var b [8]byte
		_, _ = rand.Read(b[:])
		ctx, cancel := context.WithCancel(context.Background())
		ls = &listener{pool: l.pool, channel: "fencelock_" + hex.EncodeToString(b[:]),
			lessors: make(map[string]*Lessor), cancel: cancel, logger: l.cfg.common.logger}
		listeners.byPool[l.pool] = ls
		go ls.run(ctx)
	}
	ls.mu.Lock()
	ls.lessors[l.cfg.holder] = l
	ls.mu.Unlock()
	l.listener = ls
}

// idleCheckLocked arms l's detach from the listener when l has neither a wait nor a held
// lease. l.mu must be held.
func (l *Lessor) idleCheckLocked() {
	if l.listener == nil || len(l.waits) > 0 || len(l.semWaits) > 0 || len(l.active) > 0 {
		return
	}
	if l.lingering == nil {
		l.lingering = l.cfg.clock.AfterFunc(listenerLinger, l.detachIfIdle)
	} else {
		l.lingering.Reset(listenerLinger)
	}
}

// detachIfIdle detaches l from its listener if l still has neither a wait nor a held lease;
// the last lessor out closes the connection.
func (l *Lessor) detachIfIdle() {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.listener
	if ls == nil || len(l.waits) > 0 || len(l.semWaits) > 0 || len(l.active) > 0 {
		return
	}
	l.listener = nil
	listeners.Lock()
	defer listeners.Unlock()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.lessors[l.cfg.holder] == l {
		delete(ls.lessors, l.cfg.holder)
	}
	if len(ls.lessors) == 0 {
		ls.cancel()
		ls.ready = false
		if listeners.byPool[ls.pool] == ls {
			delete(listeners.byPool, ls.pool)
		}
	}
}

// listeningChannelLocked returns the channel of l's listener while LISTEN is in place, else ""
// (a wait then polls). l.mu must be held.
func (l *Lessor) listeningChannelLocked() string {
	ls := l.listener
	if ls == nil {
		return ""
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if !ls.ready {
		return ""
	}
	return ls.channel
}

// setReady records whether LISTEN is in place, and wakes every wait of the attached lessors
// when it changed: each polls from now on, or, once it is up, refreshes its place with the
// channel.
func (ls *listener) setReady(ctx context.Context, ready bool) {
	ls.mu.Lock()
	if ctx.Err() != nil || ls.ready == ready {
		ls.mu.Unlock()
		return
	}
	ls.ready = ready
	attached := make([]*Lessor, 0, len(ls.lessors))
	for _, l := range ls.lessors {
		attached = append(attached, l)
	}
	ls.mu.Unlock()
	for _, l := range attached {
		l.mu.Lock()
		for _, w := range l.waits {
			w.signalLocked()
		}
		for _, sw := range l.semWaits {
			select {
			case sw.wake <- struct{}{}:
			default:
			}
		}
		l.mu.Unlock()
	}
}

// run keeps the listening connection open until ctx ends: on a failure waits poll
// (setReady(false)) and it opens the connection again after a backoff. Behind a pooler it
// gives up: waits poll until the last lessor detaches.
func (ls *listener) run(ctx context.Context) {
	for n := 0; ; n++ {
		listened, err := ls.session(ctx)
		ls.setReady(ctx, false)
		if listened {
			n = 0 // a new streak of failures: say it again, and retry soon
		}
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errPooled) {
			ls.logger.Warn("fencelock: " + errPooled.Error())
			return
		}
		if n == 0 {
			ls.logger.Warn("fencelock: listening connection lost; lease waiters poll until it is back", "error", err)
		}
		t := time.NewTimer(listenBackoff(n))
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
func (ls *listener) session(ctx context.Context) (listened bool, err error) {
	conn, pooled, err := openListening(ctx, ls.pool, ls.channel)
	if err != nil {
		return false, err
	}
	defer closeListening(conn)
	if pooled {
		return false, errPooled
	}
	ls.setReady(ctx, true)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		ls.dispatch(n.Payload)
	}
}

// dispatch hands a notification to the lessor it names. One for a lessor no longer attached
// is dropped: its wait is over, and leaving the queue hands on whatever was handed to it
// (leaveWait).
func (ls *listener) dispatch(payload string) {
	wk, err := parseWake(payload)
	if err != nil {
		ls.logger.Error("fencelock: unreadable notification", "payload", payload, "error", err)
		return
	}
	ls.mu.Lock()
	l := ls.lessors[wk.holder]
	ls.mu.Unlock()
	if l != nil {
		l.notified(wk)
	}
}

// handoff is a grant a release handed to one of this lessor's waits: its token and its expiry
// on the database clock.
type handoff struct {
	token     Token
	expiresAt time.Time
	waitID    int64 // the wait it was handed to (0 when found by a statement)
}

// wakeup is one notification of LeaseRelease: the wait it wakes, and the grant handed to it
// (token 0: none; the lease is free, try now).
type wakeup struct {
	holder, name string
	waitID       int64
	handoff
}

// parseWake reads a payload of LeaseRelease:
// "<wait_id> <token> <expires_at, µs> <octets of holder> <holder><name>".
func parseWake(payload string) (wakeup, error) {
	f := strings.SplitN(payload, " ", 5)
	if len(f) != 5 {
		return wakeup{}, fmt.Errorf("want 5 fields, got %d", len(f))
	}
	waitID, err1 := strconv.ParseInt(f[0], 10, 64)
	token, err2 := strconv.ParseInt(f[1], 10, 64)
	us, err3 := strconv.ParseInt(f[2], 10, 64)
	n, err4 := strconv.Atoi(f[3])
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return wakeup{}, err
	}
	if n < 0 || n > len(f[4]) {
		return wakeup{}, fmt.Errorf("holder of %d bytes in %d", n, len(f[4]))
	}
	return wakeup{holder: f[4][:n], name: f[4][n:], waitID: waitID,
		handoff: handoff{token: Token(token), expiresAt: time.UnixMicro(us)}}, nil
}

// openListening takes a connection of pool out of it (hijacked: it never goes back) and, unless
// a pooler answers for the server (pooled: the backend pid differs from the startup pid, and
// LISTEN cannot be trusted), LISTENs on channel, with idle_session_timeout off (the session
// idles by design; PostgreSQL 14+, an older server refuses the setting, which is then moot).
// The caller closes the connection with closeListening. Bounded by listenOpenTimeout.
func openListening(ctx context.Context, pool *pgxpool.Pool, channel string) (conn *pgx.Conn, pooled bool, err error) {
	octx, cancel := context.WithTimeout(ctx, listenOpenTimeout)
	defer cancel()
	pc, err := pool.Acquire(octx)
	if err != nil {
		return nil, false, err
	}
	conn = pc.Hijack()
	var pid int32
	if err := conn.QueryRow(octx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		closeListening(conn)
		return nil, false, err
	}
	if uint32(pid) != conn.PgConn().PID() {
		return conn, true, nil
	}
	_, _ = conn.Exec(octx, "SET idle_session_timeout = 0")
	if _, err := conn.Exec(octx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		closeListening(conn)
		return nil, false, err
	}
	return conn, false, nil
}

// closeListening closes a connection of openListening, bounded by closeTimeout.
func closeListening(conn *pgx.Conn) {
	cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	_ = conn.Close(cctx)
}
