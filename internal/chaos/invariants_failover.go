package chaos

import (
	"fmt"
	"slices"
	"time"
)

// GrantTokensRisePerName checks that the tokens of one name only rise in real time: a grant
// invoked after another grant of the same name returned carries a larger token. Across a
// promotion this is what epoch tokens promise, whatever WAL the promotion lost.
func GrantTokensRisePerName(h History) []Violation {
	byName := map[string][]Op{}
	for _, op := range h {
		if op.Kind == KindGrant && op.Outcome == OK {
			byName[op.Name] = append(byName[op.Name], op)
		}
	}
	var vs []Violation
	for name, grants := range byName {
		// Sorted by return, with the running maximum token and the grant that carried it.
		slices.SortFunc(grants, func(a, b Op) int { return cmpDur(a.Return, b.Return) })
		best := make([]int, len(grants)) // index of the largest token among grants[:i+1]
		for i := range grants {
			best[i] = i
			if i > 0 && grants[best[i-1]].Token > grants[i].Token {
				best[i] = best[i-1]
			}
		}
		for _, g := range grants {
			// The grants that returned before g was invoked: grants[:n].
			n, _ := slices.BinarySearchFunc(grants, g.Invoke, func(a Op, t time.Duration) int { return cmpDur(a.Return, t) })
			if n == 0 {
				continue
			}
			if prev := grants[best[n-1]]; prev.Token >= g.Token {
				vs = append(vs, Violation{"GrantTokensRisePerName", g.ID, fmt.Sprintf("%s granted %q token %d after op #%d had granted it token %d", g.Holder, name, g.Token, prev.ID, prev.Token)})
			}
		}
	}
	return vs
}

// OlderTokenAccepts finds the acknowledged appends whose token is smaller than that of an
// append to the same resource acknowledged before they were invoked. Such an append is a
// violation when that newer append is in the final ledger: the fence let an older token
// through after a newer one had committed for good. When the newer append is missing from the
// final ledger (a failover lost it, with the fence row's advance), the older one went through
// a fence that the promotion had taken back: such appends are counted in afterLoss, which is
// zero unless acknowledged writes were lost.
func OlderTokenAccepts(h History) (vs []Violation, afterLoss int) {
	final := FinalLedgers(h)
	byName := map[string][]Op{}
	for _, op := range h {
		if op.Kind == KindAppend && op.Outcome == OK {
			byName[op.Name] = append(byName[op.Name], op)
		}
	}
	for name, apps := range byName {
		slices.SortFunc(apps, func(a, b Op) int { return cmpDur(a.Return, b.Return) })
		for _, b := range apps {
			var survived, lost *Op
			for i := range apps {
				a := &apps[i]
				if a.Return >= b.Invoke {
					break
				}
				if a.Token <= b.Token {
					continue
				}
				if count(final[name], a.Value) > 0 {
					survived = a
					break
				}
				lost = a
			}
			switch {
			case survived != nil:
				vs = append(vs, Violation{"OlderTokenAccepts", b.ID, fmt.Sprintf("append %s with token %d accepted after op #%d (token %d) had committed", b.Value, b.Token, survived.ID, survived.Token)})
			case lost != nil:
				afterLoss++
			}
		}
	}
	return vs, afterLoss
}

// LostWrites returns how many acknowledged appends are missing from their final ledger.
func LostWrites(h History) int {
	final := FinalLedgers(h)
	n := 0
	for _, op := range h {
		if op.Kind == KindAppend && op.Outcome == OK && count(final[op.Name], op.Value) == 0 {
			n++
		}
	}
	return n
}

// FenceMatchesLedger checks that each resource's final high-water mark (fences) is the largest
// token in its final ledger: the fence and the write commit together, or not at all, even when
// a failover loses both.
func FenceMatchesLedger(h History, fences map[string]int64) []Violation {
	var vs []Violation
	for name, entries := range FinalLedgers(h) {
		top := int64(0)
		for _, e := range entries {
			top = max(top, EntryToken(e))
		}
		if hw, ok := fences[name]; ok && hw != top {
			vs = append(vs, Violation{"FenceMatchesLedger", -1, fmt.Sprintf("fence of %q is %d, largest token in its ledger %d", name, hw, top)})
		}
	}
	return vs
}

// CheckFailover runs the invariants that must hold across a failover. With synchronous
// replication (sync) nothing acknowledged may be lost, so every fenced-register invariant of
// [CheckRegister] applies, linearizability included, and no older token may be accepted at
// all. With asynchronous replication a promotion may lose acknowledged writes (and the fence
// advances that came with them); what must still hold: grant tokens are unique and rise per
// name, ledgers never go back in token order, no older token is accepted after a newer one
// that survived, nothing that failed or was never appended is in a ledger, each fence matches
// its ledger, and Done closes in time.
func CheckFailover(h History, fences map[string]int64, slack, timeout time.Duration, sync bool) []Violation {
	var vs []Violation
	vs = append(vs, GrantTokensRisePerName(h)...)
	older, afterLoss := OlderTokenAccepts(h)
	vs = append(vs, older...)
	if sync {
		if afterLoss > 0 {
			vs = append(vs, Violation{"OlderTokenAccepts", -1, fmt.Sprintf("%d appends with older tokens accepted after a lost newer write, under synchronous replication", afterLoss)})
		}
		return append(vs, CheckRegister(h, fences, slack, timeout)...)
	}
	vs = append(vs, TokensNeverDecrease(h)...)
	vs = append(vs, GrantTokensUnique(h)...)
	vs = append(vs, NoFailedWriteApplied(h)...)
	vs = append(vs, AppliedAtMostOnce(h)...)
	vs = append(vs, FenceMatchesLedger(h, fences)...)
	vs = append(vs, TrustWithinExpiry(h, slack)...)
	return vs
}

func cmpDur(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
