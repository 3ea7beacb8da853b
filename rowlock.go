package fencelock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/notify"
	"github.com/fencelock/fencelock/internal/queue"
	"github.com/fencelock/fencelock/internal/renewal"
	"github.com/fencelock/fencelock/internal/timing"
)

// Lessor grants named leases, rows of fencelock.leases, to one holder id. Each grant carries a
// fencing token, an int64 > 0 drawn from a sequence under the row lock, so tokens for a name
// rise strictly in grant order. TTLs are measured on the database clock. Held leases are
// renewed by a heartbeat: rounds on a timer, armed only while the lessor holds leases, renew
// the leases that are due in batches of at most 5,000, one statement each (a statement costs
// O(n) in its batch), at most two statements at a time. Each lease's trust window is ended by
// the lessor's trust watch (one timer), whatever the heartbeat is doing. Acquiring or releasing
// a lease costs O(log n) on the client in the n leases held (measured: docs/PERFORMANCE.md),
// and one lessor holds 100,000 leases (TTL 10 s) without losing one (TestScaleManyLeases).
//
// Waiters are served first come, first served: a waiting Acquire (or RunLocked) takes a place
// in the name's queue (fencelock.lease_waiters, visible in the views fencelock.lease_queue and
// fencelock.lease_queue_summary), and a release hands the lease to the head of the queue in
// its own statement and wakes that waiter alone, by NOTIFY on a listening connection that the
// lessors of one pool share. Behind a pooler, or while that connection is down, waiters poll
// with the lessor's [Backoff] instead (see [Lessor.Acquire]).
//
// A Lessor is safe for concurrent use. Grant attempts, claims of a handed-over grant and
// releases by one lessor on one name are serialised locally, so goroutines that share a lessor
// queue for a name instead of racing each other; a lessor is not re-entrant, and its goroutines
// share one place in a name's queue. It needs no Close: with no lease held and no wait it owns
// no goroutine and no armed timer (renewal statements in flight end by their deadline, the end
// of their leases' trust windows), but for its hold on its pool's listening connection, which
// it leaves after its last wait or lease, and which closes a second after its last subscriber
// leaves. The holder id must be unique among live lessors: a name's queue keeps one
// place per holder, and a hand-off is scoped to its holder.
//
// The scheme is the fencing-token lease of Gray and Cheriton (1989) and Kleppmann (2016),
// with Postgres as the lock service and the fence in the same database as the guarded data;
// the queue is the fair lock of the ZooKeeper recipes (Hunt et al., 2010) and etcd's mutex,
// with the hand-off made by the release itself.
type Lessor struct {
	pool    *pgxpool.Pool
	q       *db.Queries
	cfg     lessorConfig
	renewer *renewal.Renewer[*Lease] // the heartbeat and the trust watch of the held leases (lease.go); shares mu

	mu        sync.Mutex
	active    map[string]*Lease // held leases by name (at most one each: no re-entry)
	gates     map[string]*gate  // per-name serialisation of attempts, claims and releases
	releasing map[Token]int     // grants whose Lease.Release is in progress

	// Waits in queues and the pool's notifier (lease_queue.go, listener.go); guarded by mu.
	waits      map[string]*queue.Wait // Acquires in a queue, by name
	otherWaits int                    // waits above the core in a queue (Semaphore.Acquire's)
	listen     *notify.Subscription   // a hold on the pool's notifier while attached; nil: not
	lingering  timing.Timer           // detaches it once l has stayed idle for listenerLinger; nil until first armed

	afterGrant func() // tests only: runs after each grant statement returns
}

type gate struct {
	ch   chan struct{} // cap 1: a token to hold while attempting
	refs int
}

// NewLessor returns a lessor on pool, which must reach a primary where [Migrate] has run.
// Errors: an [*ArgumentError] for a nil pool or a bad option. No SQL runs.
//
// The heartbeat takes its connection from pool, as the lessor's grant attempts and the
// caller's own statements do, and pgxpool serves waiters in turn: a pool kept saturated for
// longer than a lease's slack (its TTL less the safety margin and the heartbeat interval)
// costs its holder the lease (Done closes, the cause [ErrTrustWindowExpired]). Size pool for
// the statements that share it, or give the lessor a pool of its own (chaos scenario 8: 200
// goroutines' attempts on a pool of 40 delayed renewals by seconds on a loaded machine).
//
// Defaults:
//   - holder: "<hostname>:<pid>:<random hex>" ([WithHolder])
//   - heartbeat: a third of each lease's TTL ([WithHeartbeatInterval], [WithoutHeartbeat])
//   - safety margin: a tenth of each lease's TTL ([WithSafetyMargin])
//   - backoff: ExponentialBackoff(5ms, 250ms) ([WithBackoff])
//   - logger: discards ([WithLogger])
func NewLessor(pool *pgxpool.Pool, opts ...LessorOption) (*Lessor, error) {
	if pool == nil {
		return nil, argError("pool", "must not be nil")
	}
	cfg, err := newLessorConfig(opts)
	if err != nil {
		return nil, err
	}
	return newLessor(pool, cfg), nil
}

// newLessor builds a lessor of cfg on pool (tests pass a manual clock in cfg).
func newLessor(pool *pgxpool.Pool, cfg lessorConfig) *Lessor {
	l := &Lessor{
		pool:      pool,
		q:         db.New(),
		cfg:       cfg,
		active:    make(map[string]*Lease),
		gates:     make(map[string]*gate),
		waits:     make(map[string]*queue.Wait),
		releasing: make(map[Token]int),
	}
	l.cfg.common.resolve()
	l.renewer = newRenewer(l)
	return l
}

// Holder returns the holder id stored with this lessor's grants ([WithHolder]; it never
// changes). Safe for concurrent use.
func (l *Lessor) Holder() string { return l.cfg.holder }

// Pool returns the pool the lessor was built on (never nil): the database of its leases, for
// mechanisms built on a lessor (package job) that keep state of their own next to the leases.
// The lessor keeps using the pool; do not close it while the lessor holds anything. Safe for
// concurrent use.
func (l *Lessor) Pool() *pgxpool.Pool { return l.pool }

// CheckTTL checks ttl (a time.Duration) as [Lessor.Acquire] does before any SQL runs: between
// [MinTTL] and [MaxTTL], longer than the lessor's safety margin, and with room for its
// heartbeat ([WithHeartbeatInterval], [WithSafetyMargin]). It returns nil or an
// [*ArgumentError] (matching [ErrInvalidArgument]) naming the setting that does not fit. No
// SQL runs; safe for concurrent use.
func (l *Lessor) CheckTTL(ttl time.Duration) error {
	_, err := l.cfg.times(ttl)
	return err
}

// Backoff returns the lessor's [Backoff] ([WithBackoff]; default ExponentialBackoff(5ms,
// 250ms)), the wait between its attempts on a lease held by someone else: for mechanisms built
// on a lessor that retry at the same pace (package job, after a failed read of the database
// clock). A Backoff is stateless and safe for concurrent use.
func (l *Lessor) Backoff() Backoff { return l.cfg.backoff }

// notAcquired maps errRefused to ErrNotAcquired at the API boundary (a *lateGrant, which is
// ErrNotAcquired for errors.Is, passes as it is).
func notAcquired(err error) error {
	if err == errRefused {
		return ErrNotAcquired
	}
	return err
}

// enterFree takes name's gate (see enter) and checks, inside it, that this lessor does not hold
// name: no other attempt of this lessor on name can grant meanwhile. The returned func ends
// the turn.
func (l *Lessor) enterFree(ctx context.Context, name string) (exit func(), err error) {
	exit, err = l.enter(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("acquire lease %q: %w", name, err)
	}
	if l.holds(name) {
		exit()
		return nil, fmt.Errorf("acquire lease %q: %w", name, ErrAlreadyHeld)
	}
	return exit, nil
}

// grantStatement runs one grant statement (run) on a pooled connection, and returns when it
// was sent. A failure other than pgx.ErrNoRows goes through grantFailed, which cleans up after
// a statement pgx gave up mid-flight (its outcome unknown) with endUnknownGrants.
func (l *Lessor) grantStatement(ctx context.Context, name string, run func(*pgxpool.Conn) error) (sent time.Time, err error) {
	return l.runGrant(ctx, fmt.Sprintf("acquire lease %q", name), run, l.endUnknownGrants([]string{name}))
}

// endUnknownGrants returns the cleanup of a grant statement on names whose outcome is unknown:
// it ends every grant of those names to this holder but the ones the lessor holds or is
// releasing and the ones a release handed to its waits (LeaseReleaseUnknown).
//
// Why it is safe: the statement may have granted only with a token of its own, which none of
// the spared grants has. A grant handed to a wait of this lessor was made by a release, never
// by the statement: the query spares it while the wait's row records it, and the keep-list
// while the wait holds it from the NOTIFY, so the Acquire that claims it (a sibling of the
// statement's caller, waiting on the name's gate) never trusts a grant this cleanup ended.
func (l *Lessor) endUnknownGrants(names []string) func(context.Context) error {
	return func(ctx context.Context) error {
		keep := []int64{}
		l.mu.Lock()
		for _, name := range names {
			if lease := l.active[name]; lease != nil {
				keep = append(keep, int64(lease.token))
			}
			if w := l.waits[name]; w != nil { // its Acquire claims them, or leaving hands them on
				keep = append(keep, w.HandedTokens()...)
			}
		}
		for token := range l.releasing { // its Release ends it, and must find it current
			keep = append(keep, int64(token))
		}
		l.mu.Unlock()
		_, err := l.q.LeaseReleaseUnknown(ctx, l.pool, db.LeaseReleaseUnknownParams{Names: names, Holder: l.cfg.holder, KeepTokens: keep})
		return err
	}
}

// runGrant is grantStatement for any grant statement (what names it in errors): unknown ends
// every grant the statement may have made, sparing the lessor's own current ones and those
// handed to its waits, after an outcome left unknown (grantFailed).
func (l *Lessor) runGrant(ctx context.Context, what string, run func(*pgxpool.Conn) error, unknown func(context.Context) error) (sent time.Time, err error) {
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		return time.Time{}, wrapPg(what, err)
	}
	pid := conn.Conn().PgConn().PID()
	sent = l.cfg.clock.Now()
	err = run(conn)
	if l.afterGrant != nil {
		l.afterGrant()
	}
	// pgx closes a connection whose statement it abandoned mid-flight; an open one means the
	// outcome is known (the statement failed, or was never sent).
	abandoned := err != nil && conn.Conn().IsClosed()
	conn.Release()
	if err == nil || errors.Is(err, pgx.ErrNoRows) {
		return sent, err
	}
	return sent, l.grantFailed(ctx, what, pid, abandoned, err, unknown)
}

// granted makes a lease of a grant sent at sent, unless its reply came after its trust window.
func (l *Lessor) granted(ctx context.Context, name string, lt leaseTimes, token Token, sent, expiresAt time.Time) (*Lease, error) {
	if token <= 0 {
		// A grant statement's placeholder (LeaseGrant draws no token on its INSERT path when
		// the row exists) came back: it cannot, but a lease must never carry it. End it.
		l.releaseToken(ctx, name, token)
		return nil, fmt.Errorf("acquire lease %q: the grant returned token %d, not a fencing token", name, token)
	}
	lease := newLease(l, name, token, lt, sent, expiresAt)
	if !l.cfg.clock.Now().Before(lease.TrustedUntil()) {
		// The reply took longer than the trust window: the grant is useless to its holder.
		// End it (scoped to this grant) and report a refusal, so Acquire tries again. Not
		// with ctx: it may have ended meanwhile, and the grant must not stay held for a TTL.
		lease.end(ErrReleased)
		l.releaseToken(ctx, name, lease.token)
		return nil, &lateGrant{what: fmt.Sprintf("lease %q", name), ttl: lt.TTL}
	}
	l.add(lease)
	return lease, nil
}

// grantFailed handles a grant statement that returned err on the session of backend pid. A
// server error means the statement failed and granted nothing; so does any error that left
// the connection open (nothing was sent, or the reply was read). An abandoned connection
// (ctx ended mid-flight, connection broke) leaves the outcome unknown, whatever pgx's
// SafeToRetry says (it calls a reset after the send "conn closed", safe to retry): the
// statement may still run, and commit, after the client gave up (it sits in the server's
// socket buffer). So grantFailed first waits until that backend has exited (the backend
// finishes the statement, fails to send the result and exits), then runs unknown, the grant's
// own cleanup, which ends what the statement may have granted, scoped to this holder and
// sparing the lessor's own current grants and every grant a release handed to one of its
// waits, which a sibling goroutine may claim and trust once this returns (a lease's:
// LeaseReleaseUnknown; a permit's: only the permit granted to the attempt's wait; a set's: its
// members). Behind a pooler the pid is
// not the backend's and the wait ends at once: the cleanup is then best effort, and a late
// grant expires by its TTL. what names the grant in errors.
func (l *Lessor) grantFailed(ctx context.Context, what string, pid uint32, abandoned bool, err error, unknown func(context.Context) error) error {
	var pgErr *pgconn.PgError
	if !abandoned || errors.As(err, &pgErr) {
		return wrapPg(what, err)
	}
	cctx, cancel := detached(ctx, cleanupTimeout)
	defer cancel()
	cerr := awaitBackendExit(cctx, l.pool, pid)
	if cerr == nil {
		cerr = unknown(cctx)
	}
	if cerr != nil {
		l.cfg.common.logger.Error("fencelock: could not end a grant of unknown outcome; it expires by its TTL",
			"what", what, "holder", l.cfg.holder, "error", cerr)
		return fmt.Errorf("%s: %w (ending the possible grant failed too, it expires by its TTL: %w)", what, err, cerr)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// releaseToken ends the grant (name, this holder, token) with LeaseRelease, detached from
// ctx's cancellation: a grant nobody will use must not stay held for a TTL. Errors are logged.
func (l *Lessor) releaseToken(ctx context.Context, name string, token Token) {
	rctx, cancel := detached(ctx, cleanupTimeout)
	defer cancel()
	if _, err := leaseRelease(rctx, l.q, l.pool, l.cfg.holder, name, token); err != nil {
		l.cfg.common.logger.Error("fencelock: could not end a grant nobody uses; it expires by its TTL",
			"lease", name, "token", int64(token), "holder", l.cfg.holder, "error", err)
	}
}

// listenerLinger is how long a lessor with neither a wait nor a held lease stays attached to
// its pool's notifier: one that releases and waits again within it finds LISTEN in place at its
// first attempt, so its place in the queue carries the channel and a release wakes it at once,
// with no poll and no second statement.
const listenerLinger = time.Second

// idleCheckLocked arms l's detach from its pool's notifier when l has neither a wait nor a held
// lease: after listenerLinger, if l is still idle then (detachIfIdle). l.mu must be held.
func (l *Lessor) idleCheckLocked() {
	if !l.idleLocked() {
		return
	}
	if l.lingering == nil {
		l.lingering = l.cfg.clock.AfterFunc(listenerLinger, l.detachIfIdle)
	} else {
		l.lingering.Reset(listenerLinger)
	}
}

// idleLocked reports whether l is attached to its notifier with neither a wait nor a held
// lease. l.mu must be held.
func (l *Lessor) idleLocked() bool {
	return l.listen != nil && len(l.waits) == 0 && l.otherWaits == 0 && len(l.active) == 0
}

// detachIfIdle detaches l from its pool's notifier if l is still idle (the notifier closes a
// second after its last subscriber leaves).
func (l *Lessor) detachIfIdle() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.idleLocked() {
		return
	}
	l.listen.Close()
	l.listen = nil
}

// holds reports whether this lessor holds a lease of name it still trusts.
func (l *Lessor) holds(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active[name] != nil
}

// enter serialises this lessor's attempts on name; the returned func ends the turn.
func (l *Lessor) enter(ctx context.Context, name string) (exit func(), err error) {
	l.mu.Lock()
	g := l.gates[name]
	if g == nil {
		g = &gate{ch: make(chan struct{}, 1)}
		l.gates[name] = g
	}
	g.refs++
	l.mu.Unlock()
	leave := func() {
		l.mu.Lock()
		if g.refs--; g.refs == 0 {
			delete(l.gates, name)
		}
		l.mu.Unlock()
	}
	select {
	case g.ch <- struct{}{}:
		return func() { <-g.ch; leave() }, nil
	case <-ctx.Done():
		leave()
		return nil, context.Cause(ctx)
	}
}
