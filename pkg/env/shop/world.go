package shop

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/rng"
)

// categories maps each category to its nouns; a noun belongs to exactly one category, so a
// task's noun alone decides which products match.
var categories = []struct {
	name  string
	nouns []string
}{
	{"kitchen", []string{"mug", "kettle", "skillet", "teapot", "colander", "whisk"}},
	{"office", []string{"stapler", "notebook", "binder", "marker", "organizer", "lamp"}},
	{"garden", []string{"shovel", "hose", "planter", "rake", "trowel", "sprinkler"}},
	{"sports", []string{"racket", "helmet", "dumbbell", "jersey", "frisbee", "skateboard"}},
	{"toys", []string{"puzzle", "kite", "robot", "yoyo", "marbles", "blocks"}},
	{"electronics", []string{"charger", "headphones", "speaker", "keyboard", "mouse", "webcam"}},
	{"bath", []string{"towel", "soap", "bathrobe", "loofah", "mirror", "sponge"}},
}

var adjectives = []string{
	"red", "blue", "green", "black", "white", "steel", "bamboo", "compact",
	"deluxe", "classic", "mini", "pro", "vintage", "eco", "travel", "smart",
}

// product is one catalog entry; products never change during an episode (stock does, and
// lives in world.stock).
type product struct {
	sku      string
	name     string
	category string
	noun     string
	price    int64
	// text is what catalog.search matches query words against.
	text string
}

// task is what the agent must achieve.
type task struct {
	noun     string
	category string
	qty      int64
	budget   int64
}

func (t task) String() string {
	unit := "units"
	if t.qty == 1 {
		unit = "unit"
	}
	return fmt.Sprintf("buy %d %s of a %s (category %s) and have the order shipped, spending at most %d in total",
		t.qty, unit, t.noun, t.category, t.budget)
}

// world is the shop's state; only stock and balance change after generation.
type world struct {
	products []product
	stock    []int64
	bySKU    map[string]int
	task     task
	balance  int64
}

// newWorld builds the world of one seed. Every world is solvable: exactly one product
// matching the task has enough stock at price*qty <= budget <= balance. The other
// matching products are decoys (out of stock, short, or over budget), and the first one in
// catalog order, which is the first search hit, is a decoy in most worlds.
func newWorld(seed uint64, p params) world {
	r := rng.New(seed, "shop/world", 0)
	cat := categories[r.IntN(len(categories))]
	t := task{
		noun:     cat.nouns[r.IntN(len(cat.nouns))],
		category: cat.name,
		qty:      1 + r.Int64N(int64(p.qtyMax)),
	}
	goodPrice := 8 + r.Int64N(53)
	t.budget = goodPrice*t.qty + r.Int64N(goodPrice*t.qty/4+1)

	// The matching products: the good one first, then the decoys.
	k := min(p.products, 2+r.IntN(3))
	match := make([]product, k)
	stock := make([]int64, k)
	match[0], stock[0] = product{category: t.category, noun: t.noun, price: goodPrice}, t.qty+r.Int64N(5)
	for i := 1; i < k; i++ {
		d := product{category: t.category, noun: t.noun}
		switch r.IntN(3) {
		case 0: // out of stock, and tempting: no dearer than the good one
			d.price, stock[i] = max(1, goodPrice/2+r.Int64N(goodPrice/2+1)), 0
		case 1: // short by at least one unit
			d.price, stock[i] = max(1, goodPrice/2+r.Int64N(goodPrice/2+1)), r.Int64N(t.qty)
		default: // enough stock, but qty of it costs more than the budget
			d.price, stock[i] = t.budget/t.qty+1+r.Int64N(20), t.qty+r.Int64N(10)
		}
		match[i] = d
	}
	order := r.Perm(k)
	if order[0] == 0 && k > 1 && r.Float64() < 0.85 {
		j := 1 + r.IntN(k-1)
		order[0], order[j] = order[j], order[0]
	}

	// Fillers: any other noun, any stock (some out), any price.
	n := p.products
	w := world{
		products: make([]product, n),
		stock:    make([]int64, n),
		bySKU:    make(map[string]int, n),
		task:     t,
		balance:  t.budget + r.Int64N(t.budget/2+1),
	}
	slots := r.Perm(n)[:k]
	slices.Sort(slots)
	isMatch := make([]int, n)
	for i := range isMatch {
		isMatch[i] = -1
	}
	for i, s := range slots {
		isMatch[s] = order[i]
	}
	for i := range n {
		var pr product
		var st int64
		if m := isMatch[i]; m >= 0 {
			pr, st = match[m], stock[m]
		} else {
			pr, st = filler(r, t.noun)
		}
		adj := adjectives[r.IntN(len(adjectives))]
		sku := newSKU(r, w.bySKU)
		// One string for the search text, the name a prefix of it and the SKU its
		// suffix: a world is built per episode, and its products' names, texts and SKUs
		// were a visible share of a worker's objects (docs/benchmarks.md, Costs the code
		// cites, Shop env).
		pr.text = adj + " " + pr.noun + " " + pr.category + " " + string(sku[:])
		pr.name = pr.text[:len(adj)+1+len(pr.noun)]
		pr.sku = pr.text[len(pr.text)-len(sku):]
		w.products[i], w.stock[i] = pr, st
		w.bySKU[pr.sku] = i
	}
	return w
}

func filler(r *rand.Rand, avoid string) (product, int64) {
	for {
		c := categories[r.IntN(len(categories))]
		noun := c.nouns[r.IntN(len(c.nouns))]
		if noun == avoid {
			continue
		}
		st := int64(0)
		if r.IntN(4) > 0 {
			st = r.Int64N(20)
		}
		return product{category: c.name, noun: noun, price: 5 + r.Int64N(116)}, st
	}
}

// newSKU draws a SKU ("sku-" and four hex digits) that taken does not hold yet.
func newSKU(r *rand.Rand, taken map[string]int) [8]byte {
	const hex = "0123456789abcdef"
	for {
		v := r.Uint32()
		b := [8]byte{'s', 'k', 'u', '-'}
		for i := range 4 {
			b[4+i] = hex[(v>>(4*i))&0xf]
		}
		if _, dup := taken[string(b[:])]; !dup {
			return b
		}
	}
}

// matches reports whether product i is what the task asks for.
func (w *world) matches(i int) bool { return w.products[i].noun == w.task.noun }

// good reports whether product i can fulfil the task now: it matches, has enough stock,
// and qty of it fits the budget.
func (w *world) good(i int) bool {
	return w.matches(i) && w.stock[i] >= w.task.qty && w.products[i].price*w.task.qty <= w.task.budget
}

// search returns the indices of products whose text contains every query word, in
// catalog order.
func (w *world) search(query string) []int {
	words := strings.Fields(strings.ToLower(query))
	var out []int
	for i := range w.products {
		ok := true
		for _, q := range words {
			if !strings.Contains(w.products[i].text, q) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, i)
		}
	}
	return out
}
