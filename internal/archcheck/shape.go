package main

import (
	"sort"
)

func (g *graph) sccs() [][]string {
	index, low := map[string]int{}, map[string]int{}
	on := map[string]bool{}
	var stack []string
	var out [][]string
	i := 0
	var visit func(string)
	visit = func(v string) {
		index[v], low[v] = i, i
		i++
		stack = append(stack, v)
		on[v] = true
		for _, w := range sortedKeys(g.edges[v]) {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var c []string
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				on[w] = false
				c = append(c, w)
				if w == v {
					break
				}
			}
			sort.Strings(c)
			out = append(out, c)
		}
	}
	for _, v := range g.nodes {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// order puts the nodes of one component in a sequence, users before what they use, leaving
// few uses that point backwards (Eades, Lin and Smyth's greedy heuristic).
func (g *graph) order(c []string) []string {
	left := map[string]bool{}
	for _, v := range c {
		left[v] = true
	}
	deg := func(v string, out bool) int {
		n := 0
		for _, w := range c {
			if !left[w] || w == v {
				continue
			}
			if out && g.edges[v][w] || !out && g.edges[w][v] {
				n++
			}
		}
		return n
	}
	var head, tail []string
	for len(left) > 0 {
		changed := true
		for changed {
			changed = false
			for _, v := range c {
				if left[v] && deg(v, true) == 0 { // uses nothing left: goes to the bottom
					tail = append([]string{v}, tail...)
					delete(left, v)
					changed = true
				} else if left[v] && deg(v, false) == 0 { // used by nothing left: top
					head = append(head, v)
					delete(left, v)
					changed = true
				}
			}
		}
		best, bestScore := "", -1<<30
		for _, v := range c {
			if left[v] {
				if s := deg(v, true) - deg(v, false); s > bestScore {
					best, bestScore = v, s
				}
			}
		}
		if best != "" {
			head = append(head, best)
			delete(left, best)
		}
	}
	return append(head, tail...)
}

// levels returns each node's floor (1 = uses nothing in the module) and the uses that point up.
func (g *graph) levels() (map[string]int, [][2]string) {
	pos := map[string]int{}
	var up [][2]string
	for _, c := range g.sccs() {
		for i, v := range g.order(c) {
			pos[v] = i
		}
		in := map[string]bool{}
		for _, v := range c {
			in[v] = true
		}
		for _, v := range c {
			for w := range g.edges[v] {
				if in[w] && pos[w] < pos[v] {
					up = append(up, [2]string{v, w})
				}
			}
		}
	}
	isUp := map[[2]string]bool{}
	for _, e := range up {
		isUp[e] = true
	}
	level := map[string]int{}
	var depth func(string, map[string]bool) int
	depth = func(v string, path map[string]bool) int {
		if l, ok := level[v]; ok {
			return l
		}
		path[v] = true
		l := 1
		for w := range g.edges[v] {
			if isUp[[2]string{v, w}] || path[w] {
				continue
			}
			l = max(l, depth(w, path)+1)
		}
		delete(path, v)
		level[v] = l
		return l
	}
	for _, v := range g.nodes {
		depth(v, map[string]bool{})
	}
	sort.Slice(up, func(i, j int) bool { return up[i][0]+up[i][1] < up[j][0]+up[j][1] })
	return level, up
}
