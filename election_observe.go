package fencelock

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/notify"
)

// observePoll is how often an observer reads the leader while LISTEN is not in place (behind a
// pooler, or while its pool's listening connection is down or opening), at most; never less
// often than a quarter of the term's TTL.
const observePoll = 250 * time.Millisecond

// observeAcquireTimeout bounds taking a session for the observer's reads (a new connection
// when the pool has no idle one), as the notifier's bounds opening its own.
const observeAcquireTimeout = 5 * time.Second

// LeaderInfo is the state of an election: who leads, in which term, and what it proclaimed.
// The zero LeaderInfo (Token 0) means nobody leads.
type LeaderInfo struct {
	Holder    string    // the leader's holder id ([Lessor.Holder])
	Token     Token     // the term's fencing token, an int64 > 0; 0 when nobody leads
	Value     string    // the value the leader proclaimed; "" until it has
	ElectedAt time.Time // when the term was granted (database clock)
	ExpiresAt time.Time // when the term lapses unless renewed (database clock)
}

// observer is the state of one Observe.
type observer struct {
	l    *Lessor
	name string
	ttl  time.Duration
	ch   chan<- LeaderInfo
	last LeaderInfo
	sent bool
	// conn is the observer's own session for its reads, taken from the pool and hijacked (the
	// pool's slot freed), as before the shared notifier: an observer needs nothing of its pool
	// once it observes, so a saturated pool does not hold its states back. Closed after a
	// failed read or probe (the next read takes another) and when the observer ends.
	conn *pgx.Conn
	// alive is when conn last answered (a read or a probe), on the local monotonic clock: it
	// is probed notify.ProbeAfter later unless a read answers first.
	alive time.Time
}

// observeLeader is Election.Observe's goroutine, for the election name of lessor l with terms
// of ttl: it delivers states to ch until ctx ends, then closes ch.
func observeLeader(ctx context.Context, l *Lessor, name string, ttl time.Duration, ch chan<- LeaderInfo) {
	defer close(ch)
	wake := make(chan struct{}, 1) // a notification of this election, or LISTEN came or went
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	sub := subscribe(l.pool, l.cfg.common.logger, notify.Elections, name, notify.Handler{
		Notify: func(string) { poke() },
		Ready:  func(bool) { poke() },
	})
	defer sub.Close()
	o := &observer{l: l, name: name, ttl: ttl, ch: ch}
	defer o.closeConn()
	poll := min(observePoll, ttl/4)
	for n := 0; ; {
		// Whether LISTEN is in place before the read: a change committed from here on is
		// then both read or notified.
		listening := sub.Channel() != ""
		wait, err := o.read(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			l.cfg.common.logger.Warn("fencelock: election observer: reading the leader failed; trying again", "election", name, "error", err)
			wait = listenBackoff(n)
			n++
		} else {
			n = 0
			wait = min(wait, ttl)
			if !listening {
				wait = min(wait, poll)
			}
		}
		if !o.await(ctx, wait, wake) {
			return
		}
	}
}

// await waits until d has passed or wake fires (true), or ctx ends (false), and meanwhile
// probes the observer's session as the notifier probes its listening connection: a half-open
// TCP flow (a NAT or firewall that dropped the idle flow, a vanished peer) gives no error, and
// the next read would otherwise find it dead only when its own deadline ends. Once the
// session has been quiet for notify.ProbeAfter, an empty statement must be answered within
// notify.ProbeTimeout; a session that does not answer is closed, and await returns at once for
// a read on another session, since notifications may have been lost with it.
func (o *observer) await(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	probe := time.NewTimer(notify.ProbeAfter)
	defer probe.Stop()
	for {
		var probeC <-chan time.Time
		if o.conn != nil {
			probe.Reset(time.Until(o.alive.Add(notify.ProbeAfter)))
			probeC = probe.C
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-wake:
			return true
		case <-probeC:
			if err := o.probe(ctx); err != nil {
				if ctx.Err() != nil {
					return false
				}
				o.l.cfg.common.logger.Warn("fencelock: election observer: its session did not answer a probe; reading on another",
					"election", o.name, "error", err)
				return true
			}
		}
	}
}

// probe sends an empty statement on the observer's session, which must answer within
// notify.ProbeTimeout; one that does not is closed.
func (o *observer) probe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, notify.ProbeTimeout)
	err := o.conn.Ping(pctx)
	cancel()
	if err != nil {
		o.closeConn()
		return err
	}
	o.alive = time.Now()
	return nil
}

// read reads the leader, delivers it if it changed, and returns how long until the current
// term lapses (a day when nobody leads; the caller caps every wait at the TTL). Taking a
// session is bounded by observeAcquireTimeout; the statement, like a probe, by
// notify.ProbeTimeout (a read on a silently dead session fails as its probe would).
func (o *observer) read(ctx context.Context) (time.Duration, error) {
	if o.conn == nil {
		actx, cancel := context.WithTimeout(ctx, observeAcquireTimeout)
		c, err := o.l.pool.Acquire(actx)
		cancel()
		if err != nil {
			return 0, err
		}
		o.conn = c.Hijack()
	}
	rctx, cancel := context.WithTimeout(ctx, notify.ProbeTimeout)
	row, err := o.l.q.ElectionLeader(rctx, o.conn, o.name)
	cancel()
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		o.closeConn() // its state is unknown: the next read takes another session
	} else {
		o.alive = time.Now()
	}
	var info LeaderInfo
	wait := 24 * time.Hour
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return 0, err
	default:
		info = leaderInfoOf(row)
		wait = row.ExpiresAt.Sub(row.ServerNow) + time.Millisecond
	}
	if o.sent && info.Token < o.last.Token && info.Token != 0 {
		return wait, nil // an older term than one delivered: cannot be current for long
	}
	if !o.sent || info.Holder != o.last.Holder || info.Token != o.last.Token || info.Value != o.last.Value {
		select {
		case o.ch <- info:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		o.last, o.sent = info, true
	}
	return wait, nil
}

// closeConn closes the observer's session, if it has one, within a second.
func (o *observer) closeConn() {
	if o.conn == nil {
		return
	}
	if o.conn.IsClosed() {
		// pgx gave up on it (a read or probe past its deadline) and would drain it for up to
		// 15 s before closing its socket: close the socket now, as the notifier does.
		_ = o.conn.PgConn().Conn().Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = o.conn.Close(ctx)
	o.conn = nil
}

// leaderInfoOf converts a leader row.
func leaderInfoOf(row db.ElectionLeaderRow) LeaderInfo {
	return LeaderInfo{Holder: row.Holder, Token: Token(row.Token), Value: row.Value, ElectedAt: row.AcquiredAt, ExpiresAt: row.ExpiresAt}
}
