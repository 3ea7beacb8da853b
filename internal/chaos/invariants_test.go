package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hb builds hand-made histories for the checker's own tests; times are in milliseconds.
type hb struct{ h History }

func (b *hb) add(op Op) *hb {
	op.ID = len(b.h)
	if op.Outcome == 0 {
		op.Outcome = OK
	}
	b.h = append(b.h, op)
	return b
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func (b *hb) grant(worker string, token int64, at int) *hb {
	return b.add(Op{Worker: worker, Kind: KindGrant, Name: "r", Holder: worker, Token: token, Invoke: ms(at), Return: ms(at)})
}

func (b *hb) app(worker string, token int64, opid string, o Outcome, from, to int) *hb {
	return b.add(Op{Worker: worker, Kind: KindAppend, Name: "r", Token: token, Value: Entry(worker, tok(token), opid), Outcome: o, Invoke: ms(from), Return: ms(to)})
}

func (b *hb) stale(worker string, token, current int64, opid string, from, to int) *hb {
	b.app(worker, token, opid, Fail, from, to)
	b.h[len(b.h)-1].Stale, b.h[len(b.h)-1].Current = true, current
	return b
}

func (b *hb) read(at int, entries ...string) *hb {
	return b.add(Op{Worker: "checker", Kind: KindRead, Name: "r", Entries: entries, Invoke: ms(at), Return: ms(at + 1)})
}

// clean is a history where a (token 1) writes, b (token 2) takes over and writes, a's late
// write is rejected as stale, and an unknown write of b did not happen.
func clean() *hb {
	b := &hb{}
	return b.grant("a", 1, 0).
		app("a", 1, "a1", OK, 1, 2).
		grant("b", 2, 3).
		app("b", 2, "b1", OK, 4, 5).
		stale("a", 1, 2, "a2", 6, 7).
		app("b", 2, "b2", Unknown, 8, 9).
		read(20, Entry("a", 1, "a1"), Entry("b", 2, "b1"))
}

func TestCleanHistoryPasses(t *testing.T) {
	h := clean().h
	require.Empty(t, CheckRegister(h, map[string]int64{"r": 2}, 0, 5*time.Second))
	// The unknown write may also have happened.
	h[len(h)-1].Entries = append(h[len(h)-1].Entries, Entry("b", 2, "b2"))
	require.Empty(t, CheckRegister(h, map[string]int64{"r": 2}, 0, 5*time.Second))
}

// Each invariant catches a history made to break it.
func TestInvariantsCatchViolations(t *testing.T) {
	e := func(w string, token int64, id string) string { return Entry(w, tok(token), id) }
	for _, tc := range []struct {
		desc  string
		h     History
		check func(History) []Violation
	}{
		{"TokensDecrease", clean().read(30, e("b", 2, "b1"), e("a", 1, "a1")).h, TokensNeverDecrease},
		{"GrantTokenShared", clean().grant("c", 2, 10).h, GrantTokensUnique},
		{"AckedWriteLost", clean().read(30, e("a", 1, "a1")).h, NoAckedWriteLost},
		{"FailedWriteApplied", clean().app("c", 3, "c1", Fail, 10, 11).read(30, e("a", 1, "a1"), e("b", 2, "b1"), e("c", 3, "c1")).h, NoFailedWriteApplied},
		{"UnknownAppliedTwice", clean().read(30, e("a", 1, "a1"), e("b", 2, "b1"), e("b", 2, "b2"), e("b", 2, "b2")).h, AppliedAtMostOnce},
		{"PhantomEntry", clean().read(30, e("a", 1, "a1"), e("b", 2, "b1"), e("z", 9, "z1")).h, AppliedAtMostOnce},
		{"StaleWriteApplied", clean().read(30, e("a", 1, "a1"), e("b", 2, "b1"), e("a", 1, "a2")).h,
			func(h History) []Violation { return StaleRejectChangedNothing(h, nil) }},
		{"StaleRejectMovedFence", clean().h,
			func(h History) []Violation { return StaleRejectChangedNothing(h, map[string]int64{"r": 5}) }},
		{"StaleRejectReportsUnknownMark", clean().stale("a", 1, 7, "a3", 10, 11).h,
			func(h History) []Violation { return StaleRejectChangedNothing(h, nil) }},
		{"NotLinearizable", clean().read(2, e("a", 1, "a1"), e("b", 2, "b1")).h, linearizable}, // a read before b's write saw it
		{"StaleAcceptedByModel", clean().app("a", 1, "a4", OK, 10, 11).read(30, e("a", 1, "a1"), e("b", 2, "b1"), e("a", 1, "a4")).h, linearizable},
		{"OrderAgainstRealTime", (&hb{}).app("a", 1, "x", OK, 0, 1).app("a", 1, "y", OK, 2, 3).read(10, e("a", 1, "y"), e("a", 1, "x")).h, linearizable},
		{"TrustedPastExpiry", (&hb{}).add(Op{Worker: "a", Kind: KindCheck, Name: "r", ServerInvoke: time.Unix(10, 0), Expires: time.Unix(9, 0)}).h,
			func(h History) []Violation { return TrustWithinExpiry(h, 0) }},
		{"DoneAfterExpiry", (&hb{}).add(Op{Worker: "a", Kind: KindDone, Name: "r", ServerReturn: time.Unix(10, 0), Expires: time.Unix(9, 0)}).h,
			func(h History) []Violation { return TrustWithinExpiry(h, 500*time.Millisecond) }},
		{"NoTakeoverAfterCrash", (&hb{}).grant("a", 1, 0).add(Op{Kind: KindFault, Name: "r", Value: "kill", Invoke: ms(10), Return: ms(10)}).grant("b", 2, 900).h,
			func(h History) []Violation { return TakeoverWithinBound(h, 500*time.Millisecond) }},
		{"NeverTakenOver", (&hb{}).grant("a", 1, 0).add(Op{Kind: KindFault, Name: "r", Value: "kill", Invoke: ms(10), Return: ms(10)}).h,
			func(h History) []Violation { return TakeoverWithinBound(h, 500*time.Millisecond) }},
		{"StockLost", (&hb{}).add(Op{Kind: KindDecrement, Name: "i", Amount: 2}).add(Op{Kind: KindDecrement, Name: "i", Amount: 3, Outcome: Unknown}).h,
			func(h History) []Violation { return StockConserved(h, 10, map[string]int{"i": 4}) }}, // 10-2 = 8, or 5: not 4
		{"StockNegative", History{}, func(h History) []Violation { return StockConserved(h, 10, map[string]int{"i": -1}) }},
		{"CapturedTwice", History{}, func(h History) []Violation { return CapturedAtMostOnce(h, map[string][]string{"o": {"x", "y"}}) }},
		{"AckedCaptureMissing", (&hb{}).add(Op{Kind: KindCapture, Name: "o", Value: "x"}).h,
			func(h History) []Violation { return CapturedAtMostOnce(h, map[string][]string{}) }},
		{"FailedCaptureApplied", (&hb{}).add(Op{Kind: KindCapture, Name: "o", Value: "x", Outcome: Fail}).h,
			func(h History) []Violation { return CapturedAtMostOnce(h, map[string][]string{"o": {"x"}}) }},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			require.NotEmpty(t, tc.check(tc.h))
		})
	}
}

// The same checks pass on the clean counterparts of the inventory, payment and takeover
// histories, so the failures above are not vacuous.
func TestInvariantsPassCleanHistories(t *testing.T) {
	dec := (&hb{}).add(Op{Kind: KindDecrement, Name: "i", Amount: 2}).add(Op{Kind: KindDecrement, Name: "i", Amount: 3, Outcome: Unknown}).h
	require.Empty(t, StockConserved(dec, 10, map[string]int{"i": 8}))
	require.Empty(t, StockConserved(dec, 10, map[string]int{"i": 5}))
	cap := (&hb{}).add(Op{Kind: KindCapture, Name: "o", Value: "x"}).add(Op{Kind: KindCapture, Name: "o", Value: "y", Outcome: Fail}).h
	require.Empty(t, CapturedAtMostOnce(cap, map[string][]string{"o": {"x"}}))
	take := (&hb{}).grant("a", 1, 0).add(Op{Kind: KindFault, Name: "r", Value: "kill", Invoke: ms(10), Return: ms(10)}).grant("b", 2, 300).h
	require.Empty(t, TakeoverWithinBound(take, 500*time.Millisecond))
	require.Equal(t, []time.Duration{ms(290)}, TakeoverTimes(take))
	trust := (&hb{}).add(Op{Worker: "a", Kind: KindCheck, Name: "r", ServerInvoke: time.Unix(8, 0), Expires: time.Unix(9, 0)}).
		add(Op{Worker: "a", Kind: KindDone, Name: "r", ServerReturn: time.Unix(9, 0), Expires: time.Unix(9, 0)}).h
	require.Empty(t, TrustWithinExpiry(trust, 0))
}

// A Done closing's own scheduler delay (Op.Late) is added to the slack, and only its own.
func TestTrustWithinExpiryAddsTheClosingsSchedulerDelay(t *testing.T) {
	done := func(late time.Duration) History {
		return (&hb{}).add(Op{Worker: "a", Kind: KindDone, Name: "r", ServerReturn: time.Unix(10, 0), Expires: time.Unix(9, 0), Late: late}).h
	}
	require.Empty(t, TrustWithinExpiry(done(600*time.Millisecond), 500*time.Millisecond), "1 s late with 600 ms of scheduler delay and 500 ms of slack")
	require.NotEmpty(t, TrustWithinExpiry(done(400*time.Millisecond), 500*time.Millisecond), "1 s late with 400 ms of scheduler delay and 500 ms of slack")
}

// The control timer's worst lateness counts only after start, from the later of a firing's
// due time and start, and includes the timer pending when the closing is seen.
func TestControlTimerWorst(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(100, 0).Add(time.Duration(ms) * time.Millisecond) }
	var ct controlTimer
	ct.seen(at(0), at(500))   // 500 ms late, all before start
	ct.seen(at(510), at(520)) // 10 ms late
	ct.seen(at(530), at(900)) // 370 ms late, 300 of it after start (600)
	require.Equal(t, 300*time.Millisecond, ct.worst(at(600), at(910), at(915)))
	require.Equal(t, 400*time.Millisecond, ct.worst(at(600), at(910), at(1310)), "the pending timer, 400 ms overdue")
	require.Equal(t, time.Duration(0), ct.worst(at(2000), at(910), at(1310)), "nothing after start")
}

// AwaitClosing returns when done closes, on an idle wait with a from in the future reporting
// no lateness at all.
func TestAwaitClosingReturnsOnClose(t *testing.T) {
	done := make(chan struct{})
	time.AfterFunc(100*time.Millisecond, func() { close(done) })
	require.Equal(t, time.Duration(0), AwaitClosing(done, func() time.Time { return time.Now().Add(time.Hour) }))
}

func TestPercentiles(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, ms(i))
	}
	p50, p99, top := Percentiles(ds)
	require.Equal(t, []time.Duration{ms(50), ms(99), ms(100)}, []time.Duration{p50, p99, top})
	p50, _, _ = Percentiles(nil)
	require.Equal(t, time.Duration(-1), p50)
}

func linearizable(h History) []Violation {
	if err := CheckLinearizable(h, 5*time.Second); err != nil {
		return []Violation{{"CheckLinearizable", -1, err.Error()}}
	}
	return nil
}

// An unknown append resolved by the final read must still fit the model: one with a token
// below the high-water mark that the read shows applied after the newer write is caught, and
// many unknown outcomes do not blow up the search.
func TestLinearizableResolvesUnknownByFinalRead(t *testing.T) {
	b := &hb{}
	b.grant("a", 1, 0).grant("b", 2, 1).
		app("b", 2, "b1", OK, 2, 3).
		app("a", 1, "a1", Unknown, 4, 5).
		read(20, Entry("b", 2, "b1"), Entry("a", 1, "a1"))
	require.ErrorIs(t, CheckLinearizable(b.h, 5*time.Second), ErrNotLinearizable)

	b = &hb{}
	b.grant("a", 1, 0)
	var final []string
	for i := range 200 { // one holder's unknown appends, every other one applied
		opid := string(rune('A'+i%26)) + string(rune('a'+i/26))
		b.app("a", 1, opid, Unknown, 1+2*i, 2+2*i)
		if i%2 == 0 {
			final = append(final, Entry("a", 1, opid))
		}
	}
	b.read(500, final...)
	require.NoError(t, CheckLinearizable(b.h, 5*time.Second))
}
