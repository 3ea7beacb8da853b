package queue

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseWake(t *testing.T) {
	tests := []struct {
		name, payload string
		want          Wakeup
	}{
		{"HandedGrant", "12 34 1700000000000000 6 worker:lease/a b",
			Wakeup{Holder: "worker", Name: ":lease/a b", WaitID: 12, Handoff: Handoff{Token: 34, ExpiresAt: time.UnixMicro(1700000000000000)}}},
		{"TryNow", "7 0 0 1 hx", Wakeup{Holder: "h", Name: "x", WaitID: 7, Handoff: Handoff{ExpiresAt: time.UnixMicro(0)}}},
		{"HolderWithSpaces", "1 2 3 3 a bname", Wakeup{Holder: "a b", Name: "name", WaitID: 1, Handoff: Handoff{Token: 2, ExpiresAt: time.UnixMicro(3)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseWake(tt.payload)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParseWakeMalformed(t *testing.T) {
	for _, payload := range []string{"", "1 2 3 4", "x 2 3 1 hn", "1 2 3 -1 hn", "1 2 3 9 hn", "1 2 3 z hn"} {
		_, err := ParseWake(payload)
		require.Error(t, err, "payload %q", payload)
	}
}

func TestNewWaitIDUnique(t *testing.T) {
	a, b := NewWaitID(), NewWaitID()
	require.Greater(t, b, a)
	require.Equal(t, "42", Key(42))
}

func TestWaitDeliverTakeRenew(t *testing.T) {
	w := NewWait()
	id := w.ID
	wake := w.Wake()
	// One for another id is dropped and wakes nobody.
	require.False(t, w.Deliver(Wakeup{WaitID: id + 1000, Handoff: Handoff{Token: 5}}))
	require.False(t, w.Pending())
	select {
	case <-wake:
		t.Fatal("woken by another wait's notification")
	default:
	}
	// "Try now": a wake-up, no grant.
	require.True(t, w.Deliver(Wakeup{WaitID: id}))
	<-wake
	require.False(t, w.Pending())
	// A grant: recorded under the id, then taken, which gives the wait a new id.
	require.True(t, w.Deliver(Wakeup{WaitID: id, Handoff: Handoff{Token: 9}}))
	require.True(t, w.Pending())
	require.Equal(t, []int64{9}, w.HandedTokens())
	got := w.TakeHanded()
	require.Equal(t, []Handoff{{Token: 9, WaitID: id}}, got)
	require.NotEqual(t, id, w.ID)
	require.False(t, w.Pending())
	// Nothing handed: the id stays.
	id = w.ID
	require.Empty(t, w.TakeHanded())
	require.Equal(t, id, w.ID)
	// RenewID drops what was handed to the old id.
	require.True(t, w.Deliver(Wakeup{WaitID: id, Handoff: Handoff{Token: 11}}))
	w.RenewID()
	require.NotEqual(t, id, w.ID)
	require.False(t, w.Pending())
}

func TestWaitClose(t *testing.T) {
	w := NewWait()
	require.False(t, w.Listening())
	w.Deliver(Wakeup{WaitID: w.ID, Handoff: Handoff{Token: 3}})
	w.NoteClaim(3)
	w.NoteClaim(4)
	handed, claimed := w.Close() // no subscription: Close is nil-safe
	require.Equal(t, []int64{3}, handed)
	require.Equal(t, map[int64]bool{3: true, 4: true}, claimed)
	require.False(t, w.Pending())
}

// fakeSub records what a wait asks of its subscription.
type fakeSub struct {
	keys   []string
	closed int
}

func (f *fakeSub) SetKey(key string) { f.keys = append(f.keys, key) }
func (f *fakeSub) Close()            { f.closed++ }

func TestWaitSubscriptionFollowsID(t *testing.T) {
	w := NewWait()
	sub := &fakeSub{}
	w.Listen(sub)
	require.True(t, w.Listening())
	first := w.ID
	w.Deliver(Wakeup{WaitID: first, Handoff: Handoff{Token: 1}})
	w.TakeHanded() // a new id: the subscription follows it
	second := w.ID
	w.RenewID()
	require.Equal(t, []string{Key(first), Key(second), Key(w.ID)}, sub.keys)
	w.Close()
	require.Equal(t, 1, sub.closed)
	require.False(t, w.Listening())
}
