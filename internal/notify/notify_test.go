package notify

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// testRegistry returns a registry whose notifiers open no connection: a test drives them with
// dispatch and setReady. started receives each notifier's context.
func testRegistry(linger time.Duration) (*registry, chan context.Context) {
	started := make(chan context.Context, 8)
	return &registry{byPool: make(map[*pgxpool.Pool]*notifier), linger: linger,
		start: func(_ *notifier, ctx context.Context) { started <- ctx }}, started
}

// recorder collects a subscription's events.
type recorder struct {
	mu       sync.Mutex
	payloads []string
	ready    []bool
}

func (r *recorder) handler() Handler {
	return Handler{
		Notify: func(p string) { r.mu.Lock(); r.payloads = append(r.payloads, p); r.mu.Unlock() },
		Ready:  func(b bool) { r.mu.Lock(); r.ready = append(r.ready, b); r.mu.Unlock() },
	}
}

func (r *recorder) got() ([]string, []bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.payloads...), append([]bool(nil), r.ready...)
}

func TestRoutingByTopicAndKey(t *testing.T) {
	reg, _ := testRegistry(time.Hour)
	pool := &pgxpool.Pool{}
	var wait7, wait8, elA, hold recorder
	s7 := reg.subscribe(pool, Wakeups, "7", wait7.handler(), Options{})
	reg.subscribe(pool, Wakeups, "8", wait8.handler(), Options{})
	reg.subscribe(pool, Elections, "a b", elA.handler(), Options{})
	reg.subscribe(pool, Wakeups, "", hold.handler(), Options{})
	n := s7.n
	n.dispatch(n.channel, "7 42 100 1 hx")
	n.dispatch(n.channel, "8 0 0 1 hy")
	n.dispatch(n.channel, "9 0 0 1 hz")       // nobody's: dropped
	n.dispatch(ElectionChannel, "a b")        // the whole payload is the key
	n.dispatch(ElectionChannel, "a")          // another election
	n.dispatch(n.channel, "a b")              // the wake-up topic, key "a"
	n.dispatch(ElectionChannel, "7 42 100 1") // the election topic, key is all of it
	p, _ := wait7.got()
	require.Equal(t, []string{"7 42 100 1 hx"}, p)
	p, _ = wait8.got()
	require.Equal(t, []string{"8 0 0 1 hy"}, p)
	p, _ = elA.got()
	require.Equal(t, []string{"a b"}, p)
	p, _ = hold.got()
	require.Empty(t, p, "a subscription with an empty key receives nothing")
}

func TestSetKeyAndClose(t *testing.T) {
	reg, _ := testRegistry(time.Hour)
	pool := &pgxpool.Pool{}
	var r recorder
	s := reg.subscribe(pool, Wakeups, "1", r.handler(), Options{})
	n := s.n
	s.SetKey("2")
	n.dispatch(n.channel, "1 0 0 0 ")
	n.dispatch(n.channel, "2 0 0 0 ")
	s.Close()
	s.Close() // idempotent
	s.SetKey("3")
	n.dispatch(n.channel, "2 0 0 0 ")
	n.dispatch(n.channel, "3 0 0 0 ")
	p, _ := r.got()
	require.Equal(t, []string{"2 0 0 0 "}, p)
	var nilSub *Subscription
	require.Empty(t, nilSub.Channel())
	nilSub.Close()
}

func TestReadinessCallbacksAndChannel(t *testing.T) {
	reg, started := testRegistry(time.Hour)
	pool := &pgxpool.Pool{}
	var a, b recorder
	sa := reg.subscribe(pool, Wakeups, "1", a.handler(), Options{})
	sb := reg.subscribe(pool, Elections, "e", b.handler(), Options{})
	ctx := <-started
	require.Empty(t, sa.Channel(), "not listening yet")
	sa.n.setReady(ctx, true)
	sa.n.setReady(ctx, true) // no change: nobody told
	require.Regexp(t, `^fencelock_[0-9a-f]{16}$`, sa.Channel())
	require.Equal(t, sa.Channel(), sb.Channel(), "one notifier per pool")
	sb.Close()
	sa.n.setReady(ctx, false)
	require.Empty(t, sa.Channel())
	_, ra := a.got()
	_, rb := b.got()
	require.Equal(t, []bool{true, false}, ra)
	require.Equal(t, []bool{true}, rb, "a closed subscription is told nothing")
}

// A notifier outlives its last subscription by its linger: a subscription within the linger
// gets the same notifier; while it has a subscription the notifier stays open past the linger
// (the subscription disarmed the idle timer); once its last subscription closed it closes, no
// sooner than the linger after, and the next subscription opens another. Judged by times the
// test observes, not by a real-time linger the machine must beat: "within the linger" is the
// time measured from s1.Close to the next subscription's return (a round in which that took
// the linger or more proves nothing and is run again with a linger twice as long; a notifier
// gone sooner fails), and "past the linger" waits until a control, the notifier of another
// pool whose last subscription closed just after s1's with the same linger, has retired, and
// then as long again.
func TestLingerAfterLastSubscription(t *testing.T) {
	for linger := 20 * time.Millisecond; !lingerRound(t, linger); linger *= 2 {
		require.Less(t, linger, 5*time.Second, "no subscription came within the linger of the Close before it, even with a linger of %v", linger)
	}
}

// lingerRound is one round of TestLingerAfterLastSubscription with linger; false when the
// subscription after s1.Close came too late to tell anything.
func lingerRound(t *testing.T, linger time.Duration) bool {
	reg, started := testRegistry(linger)
	pool, other := &pgxpool.Pool{}, &pgxpool.Pool{}
	s1 := reg.subscribe(pool, Wakeups, "", Handler{}, Options{})
	ctx1 := <-started
	so := reg.subscribe(other, Wakeups, "", Handler{}, Options{})
	ctxo := <-started
	require.NotSame(t, s1.n, so.n, "a notifier per pool")
	closed := time.Now()
	s1.Close()
	so.Close() // the control: its idle timer is armed after s1's, with the same linger
	// Back within the linger: the same notifier, still open.
	s2 := reg.subscribe(pool, Wakeups, "", Handler{}, Options{})
	if took := time.Since(closed); s2.n != s1.n {
		require.GreaterOrEqual(t, took, linger, "the notifier closed %v after its last subscription did, within its linger (%v)", took, linger)
		t.Logf("linger %v: the next subscription came %v after the Close, past the linger: again with a longer one", linger, took)
		s2.Close()
		return false
	}
	// Past the linger: the control retired (s1's timer, armed before the control's, would
	// have fired by then), and as long again for a retire of s1's notifier to have run.
	select {
	case <-ctxo.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the control notifier did not close after its linger")
	}
	waited := time.Since(closed)
	time.Sleep(waited)
	require.NoError(t, ctx1.Err(), "the notifier closed while it had a subscription (%v after the Close, linger %v)", time.Since(closed), linger)
	// Past the linger after the last one: closed, and the next subscription opens another.
	closed = time.Now()
	s2.Close()
	select {
	case <-ctx1.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the notifier did not close after its linger")
	}
	require.GreaterOrEqual(t, time.Since(closed), linger, "the notifier closed before its linger")
	s3 := reg.subscribe(pool, Wakeups, "", Handler{}, Options{})
	<-started
	require.NotSame(t, s1.n, s3.n)
	reg.mu.Lock()
	require.Len(t, reg.byPool, 1, "the control's notifier retired, this pool's has a subscription")
	reg.mu.Unlock()
	s3.Close()
	require.Eventually(t, func() bool {
		reg.mu.Lock()
		defer reg.mu.Unlock()
		return len(reg.byPool) == 0
	}, 10*time.Second, 5*time.Millisecond)
	t.Logf("linger %v: the control retired %v after the Close; s1's notifier kept through %v", linger, waited, 2*waited)
	return true
}

// Deliver hands a notification on one of the process's notifier channels to the
// subscriptions it is routed to, as the notifier would on receiving the NOTIFY, and reports
// true; a channel no notifier of the process has (another process's waiter), the election
// channel and the empty channel are not delivered (false: the caller sends the NOTIFY). A
// retired notifier's channel is no longer delivered to.
func TestDeliverToThisProcess(t *testing.T) {
	reg, _ := testRegistry(time.Millisecond)
	p1, p2 := &pgxpool.Pool{}, &pgxpool.Pool{}
	var w7, w8 recorder
	s7 := reg.subscribe(p1, Wakeups, "7", w7.handler(), Options{})
	s8 := reg.subscribe(p2, Wakeups, "8", w8.handler(), Options{})
	require.True(t, reg.deliver(s7.n.channel, "7 42 100 1 hx"))
	require.True(t, reg.deliver(s8.n.channel, "8 43 100 1 hy"))
	require.True(t, reg.deliver(s8.n.channel, "9 44 100 1 hz"), "the channel is this process's: delivered, and dropped as nobody's")
	require.False(t, reg.deliver("fencelock_0000000000000000", "7 45 100 1 hx"), "another process's channel")
	require.False(t, reg.deliver(ElectionChannel, "a"))
	require.False(t, reg.deliver("", "7 46 100 1 hx"))
	p, _ := w7.got()
	require.Equal(t, []string{"7 42 100 1 hx"}, p)
	p, _ = w8.got()
	require.Equal(t, []string{"8 43 100 1 hy"}, p)

	ch := s7.n.channel
	s7.Close()
	require.Eventually(t, func() bool { return !reg.deliver(ch, "7 47 100 1 hx") }, 10*time.Second, time.Millisecond,
		"a retired notifier's channel is not delivered to")
}
