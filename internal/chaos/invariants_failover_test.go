package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A token that goes back after a failover: b's grant, invoked after a's returned, carries a
// smaller token.
func TestGrantTokensRisePerName(t *testing.T) {
	b := &hb{}
	b.grant("a", 10, 0).grant("b", 20, 5)
	require.Empty(t, GrantTokensRisePerName(b.h))
	b.grant("c", 15, 10) // after both returned: below 20
	vs := GrantTokensRisePerName(b.h)
	require.Len(t, vs, 1)
	require.Equal(t, 2, vs[0].Op)
	// Overlapping grants (the second invoked before the first returned) are not ordered.
	o := &hb{}
	o.add(Op{Worker: "a", Kind: KindGrant, Name: "r", Token: 10, Invoke: ms(0), Return: ms(10)})
	o.add(Op{Worker: "b", Kind: KindGrant, Name: "r", Token: 5, Invoke: ms(5), Return: ms(6)})
	require.Empty(t, GrantTokensRisePerName(o.h))
	// Failed grants carry no token.
	f := &hb{}
	f.grant("a", 10, 0).add(Op{Worker: "b", Kind: KindGrant, Name: "r", Token: 0, Outcome: Fail, Invoke: ms(5), Return: ms(6)})
	require.Empty(t, GrantTokensRisePerName(f.h))
}

// An older token accepted after a newer one committed is a violation; after a newer one that
// a failover lost, it is counted apart.
func TestOlderTokenAccepts(t *testing.T) {
	b := &hb{}
	b.grant("a", 5, 0).grant("b", 9, 1).
		app("b", 9, "b1", OK, 2, 3).
		app("a", 5, "a1", OK, 4, 5). // the paused holder's write, after b's
		read(10, Entry("b", 9, "b1"), Entry("a", 5, "a1"))
	vs, lost := OlderTokenAccepts(b.h)
	require.Len(t, vs, 1)
	require.Equal(t, 3, vs[0].Op)
	require.Zero(t, lost)

	b.h[len(b.h)-1].Entries = []string{Entry("a", 5, "a1")} // b1 lost in the failover
	vs, lost = OlderTokenAccepts(b.h)
	require.Empty(t, vs)
	require.Equal(t, 1, lost)
	require.Equal(t, 1, LostWrites(b.h))
}

// Under asynchronous replication a lost acknowledged write is a figure, not a violation;
// under synchronous replication it is a violation.
func TestCheckFailoverLostWrite(t *testing.T) {
	b := &hb{}
	b.grant("a", 1, 0).
		app("a", 1, "a1", OK, 1, 2).
		app("a", 1, "a2", OK, 3, 4). // lost
		grant("b", 1<<47|1, 10).
		app("b", 1<<47|1, "b1", OK, 11, 12).
		read(20, Entry("a", 1, "a1"), Entry("b", 1<<47|1, "b1"))
	fences := map[string]int64{"r": 1<<47 | 1}
	require.Empty(t, CheckFailover(b.h, fences, 0, 5*time.Second, false))
	vs := CheckFailover(b.h, fences, 0, 5*time.Second, true)
	require.NotEmpty(t, vs)
	require.Equal(t, "NoAckedWriteLost", vs[0].Invariant)

	require.NotEmpty(t, CheckFailover(b.h, map[string]int64{"r": 1}, 0, 5*time.Second, false), "a fence behind its ledger")
}
