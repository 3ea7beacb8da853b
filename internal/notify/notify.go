// Package notify is the notifier of a pool: one listening connection per pool, shared by
// every feature of the process that waits on that pool (lease queues, semaphore waits,
// election observers), with subscriptions by topic and key, reconnection with backoff, pooler
// detection and readiness callbacks.
//
// # The connection
//
// The first [Subscribe] on a pool opens its notifier: a goroutine takes a connection out of
// the pool (hijacked: the pool's connect hooks apply, and the pool's slot is freed), checks
// that it reaches its own server session, turns idle_session_timeout off (the session idles by
// design; PostgreSQL 14+) and LISTENs on the notifier's own channel ("fencelock_" and 16
// random hex digits, read with [Subscription.Channel]) and on [ElectionChannel]. One session
// per pool, not per waiter: PostgreSQL's notify queue is one per database, and each NOTIFY
// signals every listening session of the database, which reads the queue in a short read-only
// transaction. The notifier closes a second (linger) after its last subscription closed, so a
// process that waits, holds and waits again keeps it.
//
// # Routing
//
// A notification on the notifier's own channel ([Wakeups]) goes to the subscriptions whose key
// is the payload's first field, up to the first space: the wait id of fencelock.hand_off's and
// fencelock.semaphore_release's payloads, "<wait_id> <token> <expires_at, µs> <octets of
// holder> <holder><name>" (package internal/queue reads them). One on [ElectionChannel]
// ([Elections]) goes to the subscriptions whose key is the whole payload: the election's name
// (the queries ElectionProclaim and ElectionNotify send it). A notification nobody subscribed
// to is dropped. The package runs no query of sqlc's; its SQL is its own session's setup
// (pg_backend_pid, SET idle_session_timeout, LISTEN).
//
// # Readiness and the fallback
//
// A subscription reads whether LISTEN is in place ([Subscription.Channel] is then not empty)
// and is told each change (Handler.Ready). Where LISTEN cannot work, subscribers poll: behind
// a pooler (the backend pid the server reports differs from the one the connection got at
// startup, as for session advisory locks: transaction pooling would lose the LISTEN; session
// pooling is treated the same, conservatively; [ErrPooled] is logged once and the notifier
// stays down until its last subscription closes), and while the connection is down
// (terminated, broken, or silently dead), which it opens again with backoff. A connection can
// die without an error: a half-open TCP flow (a NAT or firewall that dropped the idle flow, a
// peer that vanished) delivers nothing, and the kernel may keep it for minutes. So the
// notifier probes a connection that has been quiet for 2 s with an empty statement, and a
// probe not answered within 2 s ends the session: a silently dead connection is noticed
// within 4 s, its subscribers are told (Handler.Ready(false)) and poll until a new
// connection listens. No wake-up is needed for safety:
// what a NOTIFY announces is in the database, and a subscriber that missed it finds it at its
// next poll.
//
// The design is river's internal/notifier (one LISTEN connection per process, subscriptions by
// topic, reconnection and fallback in one place).
package notify

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ElectionChannel is the NOTIFY channel of every election; the payload is the election's name.
const ElectionChannel = "fencelock_election"

// ErrPooled says that the listening connection reaches the server through a pooler, where
// LISTEN cannot be trusted: the notifier's subscribers poll.
var ErrPooled = errors.New("a pooler sits between client and server (backend pid differs from the startup pid): LISTEN cannot be trusted; lease waiters poll")

// Topic is what a subscription listens to, and how its notifications are routed.
type Topic uint8

const (
	// Wakeups is the notifier's own channel; a notification goes to the subscriptions whose
	// key is its payload's first field (a wait id).
	Wakeups Topic = iota
	// Elections is [ElectionChannel]; a notification goes to the subscriptions whose key is
	// its whole payload (an election's name).
	Elections
	topics
)

// Handler receives a subscription's events. Both functions run on the notifier's goroutine
// with none of its locks held; they must not block for long (a non-blocking send, a short
// critical section), since the notifier reads no notification meanwhile. Notify may also run
// on the goroutine of a [Deliver] call, concurrently with the notifier's: it must be safe for
// concurrent use.
type Handler struct {
	// Notify receives a notification routed to the subscription (nil: none wanted).
	Notify func(payload string)
	// Ready is told when LISTEN comes up (true) or goes down (false) (nil: not wanted).
	Ready func(ready bool)
}

// Options configure the notifier that a [Subscribe] opens; a subscription to a pool whose
// notifier is open already uses that notifier's.
type Options struct {
	// Logger receives the notifier's warnings (connection lost, pooler detected); nil
	// discards them.
	Logger *slog.Logger
	// Backoff paces attempts to open the connection again (attempt 0, 1, ...); nil: 10 ms.
	Backoff func(attempt int) time.Duration
}

// The listening connection's health: after ProbeAfter without a notification, the notifier
// sends a probe (an empty statement) that must be answered within ProbeTimeout, else the
// connection is taken for dead, closed, and opened again; subscribers poll meanwhile. So a
// connection that died silently is noticed within ProbeAfter + ProbeTimeout (4 s) of its last
// sign of life. Exported for the sessions that must be noticed dead within the same bound (an
// election observer's reading session).
const (
	ProbeAfter   = 2 * time.Second
	ProbeTimeout = 2 * time.Second
)

// probeAfter and probeTimeout are the notifier's ProbeAfter and ProbeTimeout; variables, for
// the tests of this package.
var (
	probeAfter   = ProbeAfter
	probeTimeout = ProbeTimeout
)

const (
	linger       = time.Second     // the notifier outlives its last subscription by this
	openTimeout  = 5 * time.Second // bounds opening the connection (connect, pooler check, LISTEN)
	closeTimeout = 5 * time.Second // bounds closing it
)

// Subscription is one subscriber's interest in a pool's notifier; it keeps the notifier open
// until [Subscription.Close]. Its methods are safe for concurrent use, and nil-safe: a nil
// *Subscription reads as not listening.
type Subscription struct {
	n     *notifier
	topic Topic
	h     Handler

	// Guarded by n.mu.
	key    string
	closed bool
}

// Subscribe subscribes h to topic on pool's notifier under key, opening the notifier with
// opts if pool has none. An empty key receives no notification (a hold: it keeps the
// notifier open and reads its readiness). h.Notify must be safe for concurrent use: a
// [Deliver] may call it while the notifier does. The connection opens in the background: Channel is
// empty until LISTEN is in place, and h.Ready is told then. Safe for concurrent use.
func Subscribe(pool *pgxpool.Pool, topic Topic, key string, h Handler, opts Options) *Subscription {
	return pools.subscribe(pool, topic, key, h, opts)
}

// Deliver hands the notification (channel, payload) straight to the subscriptions it is
// routed to, when channel is the own channel of one of this process's notifiers: a NOTIFY this
// process would send to itself, delivered without a statement, a commit and the listening
// connection's round trip. It reports whether it did; false (no notifier of this process has
// that channel: the waiter is in another process, or its notifier was retired) means the
// caller must send the NOTIFY. The notifier need not be ready: a subscriber of a notifier
// whose connection is down polls, and is woken as well. Safe for concurrent use.
func Deliver(channel, payload string) bool { return pools.deliver(channel, payload) }

func (r *registry) deliver(channel, payload string) bool {
	if channel == "" || channel == ElectionChannel {
		return false
	}
	r.mu.Lock()
	var to *notifier
	for _, n := range r.byPool {
		if n.channel == channel {
			to = n
			break
		}
	}
	r.mu.Unlock()
	if to == nil {
		return false
	}
	to.dispatch(channel, payload)
	return true
}

// Channel returns the notifier's own channel while LISTEN is in place, else "" (the
// subscriber then polls).
func (s *Subscription) Channel() string {
	if s == nil {
		return ""
	}
	s.n.mu.Lock()
	defer s.n.mu.Unlock()
	if !s.n.ready {
		return ""
	}
	return s.n.channel
}

// SetKey routes the notifications of key to s from now on, instead of those of its former
// key. One already being delivered under the former key may still reach s.
func (s *Subscription) SetKey(key string) {
	n := s.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if s.closed || s.key == key {
		return
	}
	n.unindexLocked(s)
	s.key = key
	n.indexLocked(s)
}

// Close ends s: no more events (one being delivered may still arrive), and the notifier
// closes a second after its last subscription has. Later calls do nothing.
func (s *Subscription) Close() {
	if s == nil {
		return
	}
	n := s.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	n.unindexLocked(s)
	delete(n.subs, s)
	if len(n.subs) == 0 {
		n.idleGen++
		gen := n.idleGen
		n.idle = time.AfterFunc(n.reg.linger, func() { n.reg.retire(n, gen) })
	}
}

// registry holds the notifier of each pool with subscriptions (or lingering after its last).
type registry struct {
	mu     sync.Mutex
	byPool map[*pgxpool.Pool]*notifier
	linger time.Duration
	// start runs a new notifier's connection until ctx ends (notifier.run; tests replace it).
	start func(n *notifier, ctx context.Context)
}

// pools is the process's registry: one notifier per pool.
var pools = &registry{byPool: make(map[*pgxpool.Pool]*notifier), linger: linger, start: (*notifier).run}

// notifier is the listening connection of one pool.
type notifier struct {
	reg     *registry
	pool    *pgxpool.Pool
	channel string // "fencelock_" and 16 hex digits
	logger  *slog.Logger
	backoff func(int) time.Duration
	cancel  context.CancelFunc // stops the goroutine

	mu      sync.Mutex
	subs    map[*Subscription]bool
	byKey   [topics]map[string]map[*Subscription]bool
	ready   bool        // LISTEN is in place on a direct session
	idle    *time.Timer // retires the notifier; armed while it has no subscription
	idleGen uint64      // counts the idle timers armed: only the current one's retire counts
	closed  bool        // retired: a new subscription opens a new notifier
}

func (r *registry) subscribe(pool *pgxpool.Pool, topic Topic, key string, h Handler, opts Options) *Subscription {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.byPool[pool]
	if n == nil {
		var b [8]byte
		_, _ = rand.Read(b[:])
		ctx, cancel := context.WithCancel(context.Background())
		n = &notifier{reg: r, pool: pool, channel: "fencelock_" + hex.EncodeToString(b[:]),
			logger: opts.Logger, backoff: opts.Backoff, cancel: cancel, subs: make(map[*Subscription]bool)}
		if n.logger == nil {
			n.logger = slog.New(slog.DiscardHandler)
		}
		if n.backoff == nil {
			n.backoff = func(int) time.Duration { return 10 * time.Millisecond }
		}
		for i := range n.byKey {
			n.byKey[i] = make(map[string]map[*Subscription]bool)
		}
		r.byPool[pool] = n
		go r.start(n, ctx)
	}
	s := &Subscription{n: n, topic: topic, key: key, h: h}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.idle != nil {
		n.idle.Stop() // retire, if it runs anyway, finds a subscription and does nothing
		n.idle = nil
	}
	n.subs[s] = true
	n.indexLocked(s)
	return s
}

// retire closes n if it still has no subscription and gen is its current idle timer.
func (r *registry) retire(n *notifier, gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n.mu.Lock()
	defer n.mu.Unlock()
	// A timer that fired while a subscription came (its Stop was too late) and went again
	// (arming a timer of its own) is stale: the notifier keeps the full linger of the new one.
	if len(n.subs) > 0 || n.closed || gen != n.idleGen {
		return
	}
	n.closed = true
	n.cancel()
	n.ready = false
	if r.byPool[n.pool] == n {
		delete(r.byPool, n.pool)
	}
}

func (n *notifier) indexLocked(s *Subscription) {
	if s.key == "" {
		return
	}
	m := n.byKey[s.topic][s.key]
	if m == nil {
		m = make(map[*Subscription]bool)
		n.byKey[s.topic][s.key] = m
	}
	m[s] = true
}

func (n *notifier) unindexLocked(s *Subscription) {
	m := n.byKey[s.topic][s.key]
	delete(m, s)
	if len(m) == 0 {
		delete(n.byKey[s.topic], s.key)
	}
}

// dispatch hands a notification on channel to the subscriptions it is routed to.
func (n *notifier) dispatch(channel, payload string) {
	topic, key := Wakeups, payload
	if channel == ElectionChannel {
		topic = Elections
	} else if i := strings.IndexByte(payload, ' '); i >= 0 {
		key = payload[:i]
	}
	n.mu.Lock()
	var to []func(string)
	for s := range n.byKey[topic][key] {
		if s.h.Notify != nil {
			to = append(to, s.h.Notify)
		}
	}
	n.mu.Unlock()
	for _, f := range to {
		f(payload)
	}
}

// setReady records whether LISTEN is in place, and tells every subscription when it changed:
// each polls from now on or, once it is up, may tell the database its channel.
func (n *notifier) setReady(ctx context.Context, ready bool) {
	n.mu.Lock()
	if ctx.Err() != nil || n.ready == ready {
		n.mu.Unlock()
		return
	}
	n.ready = ready
	var to []func(bool)
	for s := range n.subs {
		if s.h.Ready != nil {
			to = append(to, s.h.Ready)
		}
	}
	n.mu.Unlock()
	for _, f := range to {
		f(ready)
	}
}
