package shop

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Causal rules the shop checks, as reported in CausalViolation.rule and in the "rule"
// field of the failed call's observation.
const (
	// RuleOrderExists: payment and shipping need an order created by order.create.
	RuleOrderExists = "order_exists"
	// RuleInventoryBeforePayment: paying needs the order's quantity in stock.
	RuleInventoryBeforePayment = "inventory_before_payment"
	// RuleSufficientBalance: paying needs a wallet balance that covers the order.
	RuleSufficientBalance = "sufficient_balance"
	// RulePayOnce: an order is paid once.
	RulePayOnce = "pay_once"
	// RuleShipBeforePayment: shipping needs a paid order.
	RuleShipBeforePayment = "ship_before_payment"
	// RuleShipOnce: an order ships once.
	RuleShipOnce = "ship_once"
	// RuleRespectRetryAfter: a service that answered with Retry-After keeps failing until
	// that time has passed on the virtual clock.
	RuleRespectRetryAfter = "respect_retry_after"
)

// maxHits bounds catalog.search results, keeping observations small.
const maxHits = 10

// toolDef is one tool of the shop: its service (index into serviceNames, -1 for none), its
// arguments, and what it does to the world.
type toolDef struct {
	name    string
	service string
	svc     int
	desc    string
	fields  []field
	run     func(e *episode, a *args, s *stepState) any
	// schema and usage are derived from fields at init.
	schema []byte
	usage  string
}

var toolDefs = []toolDef{
	{name: "catalog.search", service: "catalog", fields: []field{fQuery}, run: (*episode).search,
		desc: "Search the catalog; returns up to 10 matching products (sku, name, price) and the total count."},
	{name: "catalog.get", service: "catalog", fields: []field{fSKU}, run: (*episode).get,
		desc: "Get one product: sku, name, category, price."},
	{name: "inventory.get", service: "inventory", fields: []field{fSKU}, run: (*episode).inventory,
		desc: "Get the units of a sku in stock."},
	{name: "order.create", service: "orders", fields: []field{fSKU, fQty}, run: (*episode).create,
		desc: "Create an order for qty units of a sku; returns its order_id and amount. Reserves nothing: stock and balance are checked at payment."},
	{name: "order.status", service: "orders", fields: []field{fOrderID}, run: (*episode).status,
		desc: "Get an order: sku, qty, amount, order_status (created, paid, shipped)."},
	{name: "payment.pay", service: "payment", fields: []field{fOrderID}, run: (*episode).pay,
		desc: "Pay an order from the wallet; takes its units from stock."},
	{name: "wallet.balance", service: "payment", run: (*episode).balance,
		desc: "Get the wallet balance."},
	{name: "shipping.ship", service: "shipping", fields: []field{fOrderID}, run: (*episode).ship,
		desc: "Ship a paid order."},
	{name: "wait", fields: []field{fMs}, run: (*episode).wait,
		desc: "Let ms virtual milliseconds pass without calling any service (e.g. to honour retry_after_ms)."},
}

// toolNames lists the tools in Spec order.
var toolNames []string

func init() {
	for i := range toolDefs {
		t := &toolDefs[i]
		t.svc = -1
		for j, s := range serviceNames {
			if s == t.service {
				t.svc = j
			}
		}
		t.schema = schemaOf(t.fields)
		t.usage = usageOf(t.name, t.fields)
		toolNames = append(toolNames, t.name)
	}
}

func lookupTool(name string) *toolDef {
	for i := range toolDefs {
		if toolDefs[i].name == name {
			return &toolDefs[i]
		}
	}
	return nil
}

// Observations. Field order is the encoding order, so every observation is canonical.

type resetObs struct {
	Task       string   `json:"task"`
	Item       string   `json:"item"`
	Category   string   `json:"category"`
	Qty        int64    `json:"qty"`
	Budget     int64    `json:"budget"`
	Balance    int64    `json:"balance"`
	DeadlineMs int64    `json:"deadline_ms"`
	MaxSteps   uint32   `json:"max_steps"`
	Tools      []string `json:"tools"`
}

type errObs struct {
	OK           bool   `json:"ok"`
	Status       uint32 `json:"status,omitempty"`
	Error        string `json:"error"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
	Rule         string `json:"rule,omitempty"`
	Reason       string `json:"reason,omitempty"`
	Suggestion   string `json:"suggestion,omitempty"`
}

type truncObs struct {
	Truncated bool   `json:"truncated"`
	Body      string `json:"body"`
}

type hit struct {
	SKU   string `json:"sku"`
	Name  string `json:"name"`
	Price int64  `json:"price"`
}

type searchObs struct {
	OK      bool  `json:"ok"`
	Total   int   `json:"total"`
	Results []hit `json:"results"`
}

type productObs struct {
	OK       bool   `json:"ok"`
	SKU      string `json:"sku"`
	Name     string `json:"name"`
	Category string `json:"category"`
	Price    int64  `json:"price"`
}

type stockObs struct {
	OK    bool   `json:"ok"`
	SKU   string `json:"sku"`
	Stock int64  `json:"stock"`
}

type orderObs struct {
	OK          bool   `json:"ok"`
	OrderID     string `json:"order_id"`
	SKU         string `json:"sku"`
	Qty         int64  `json:"qty"`
	Amount      int64  `json:"amount"`
	OrderStatus string `json:"order_status"`
}

type payObs struct {
	OK          bool   `json:"ok"`
	OrderID     string `json:"order_id"`
	OrderStatus string `json:"order_status"`
	Amount      int64  `json:"amount"`
	Balance     int64  `json:"balance"`
}

type shipObs struct {
	OK          bool   `json:"ok"`
	OrderID     string `json:"order_id"`
	OrderStatus string `json:"order_status"`
}

type balanceObs struct {
	OK      bool  `json:"ok"`
	Balance int64 `json:"balance"`
}

type waitObs struct {
	OK        bool  `json:"ok"`
	WaitedMs  int64 `json:"waited_ms"`
	ElapsedMs int64 `json:"elapsed_ms"`
}

// Tool implementations. Each returns the observation; failures go through stepState.fail.

func (e *episode) search(a *args, s *stepState) any {
	idx := e.w.search(a.query)
	hits := make([]hit, 0, min(len(idx), maxHits))
	for _, i := range idx[:min(len(idx), maxHits)] {
		p := &e.w.products[i]
		hits = append(hits, hit{SKU: p.sku, Name: p.name, Price: p.price})
		if e.w.matches(i) {
			s.reach(progressFound, true)
		}
	}
	return searchObs{OK: true, Total: len(idx), Results: hits}
}

func (e *episode) product(sku string, s *stepState) (int, *errObs) {
	i, ok := e.w.bySKU[sku]
	if !ok {
		o := s.fail("", fmt.Sprintf("unknown sku %q", clip(sku)), "", "find skus with catalog.search")
		return 0, &o
	}
	return i, nil
}

func (e *episode) get(a *args, s *stepState) any {
	i, bad := e.product(a.sku, s)
	if bad != nil {
		return bad
	}
	if e.w.matches(i) {
		s.reach(progressFound, true)
	}
	p := &e.w.products[i]
	return productObs{OK: true, SKU: p.sku, Name: p.name, Category: p.category, Price: p.price}
}

func (e *episode) inventory(a *args, s *stepState) any {
	i, bad := e.product(a.sku, s)
	if bad != nil {
		return bad
	}
	if e.w.good(i) {
		s.reach(progressStocked, true)
	}
	return stockObs{OK: true, SKU: e.w.products[i].sku, Stock: e.w.stock[i]}
}

func (e *episode) create(a *args, s *stepState) any {
	i, bad := e.product(a.sku, s)
	if bad != nil {
		return bad
	}
	p := &e.w.products[i]
	o := order{product: i, qty: a.qty, amount: p.price * a.qty, status: statusCreated}
	e.orders = append(e.orders, o)
	id := orderID(len(e.orders) - 1)
	s.diff.addOrder("orders/"+id, p.sku, o.qty, o.amount, o.status)
	if e.w.good(i) && a.qty == e.w.task.qty {
		s.reach(progressOrdered, false)
	}
	return orderObs{OK: true, OrderID: id, SKU: p.sku, Qty: o.qty, Amount: o.amount, OrderStatus: o.status}
}

func orderID(i int) string { return "o-" + strconv.Itoa(i+1) }

// order finds an order by id; only the canonical form "o-<n>" names one.
func (e *episode) order(id string) (int, bool) {
	num, ok := strings.CutPrefix(id, "o-")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 || n > len(e.orders) || orderID(n-1) != id {
		return 0, false
	}
	return n - 1, true
}

func (e *episode) status(a *args, s *stepState) any {
	k, ok := e.order(a.orderID)
	if !ok {
		return s.fail("", fmt.Sprintf("unknown order %q", clip(a.orderID)), "", "use an order_id returned by order.create")
	}
	o := &e.orders[k]
	return orderObs{OK: true, OrderID: orderID(k), SKU: e.w.products[o.product].sku, Qty: o.qty, Amount: o.amount, OrderStatus: o.status}
}

func (e *episode) unknownOrder(id string, s *stepState) errObs {
	return s.fail(RuleOrderExists, fmt.Sprintf("unknown order %q", clip(id)),
		fmt.Sprintf("no order %q exists", clip(id)),
		"create one with order.create and use the order_id it returns")
}

func (e *episode) pay(a *args, s *stepState) any {
	k, ok := e.order(a.orderID)
	if !ok {
		return e.unknownOrder(a.orderID, s)
	}
	o := &e.orders[k]
	id := orderID(k)
	if o.status != statusCreated {
		return s.fail(RulePayOnce, "order already paid",
			fmt.Sprintf("order %s is already %s", id, o.status),
			"check order.status before paying again")
	}
	if short := o.qty - e.w.stock[o.product]; short > 0 {
		return s.fail(RuleInventoryBeforePayment, "insufficient stock", plural(short, "item")+" short",
			"query inventory.get first and pick a sku with enough stock")
	}
	if short := o.amount - e.w.balance; short > 0 {
		return s.fail(RuleSufficientBalance, "insufficient balance",
			fmt.Sprintf("balance %d is %d short of %d", e.w.balance, short, o.amount),
			"check wallet.balance and pick a cheaper sku or a smaller qty")
	}
	sku := e.w.products[o.product].sku
	s.diff.setString("orders/"+id+"/status", o.status, statusPaid)
	s.diff.setInt("inventory/"+sku+"/stock", e.w.stock[o.product], e.w.stock[o.product]-o.qty)
	s.diff.setInt("wallet/balance", e.w.balance, e.w.balance-o.amount)
	o.status = statusPaid
	e.w.stock[o.product] -= o.qty
	e.w.balance -= o.amount
	e.spent += o.amount
	s.spend = o.amount
	if e.fulfils(*o) && e.spent <= e.w.task.budget {
		s.reach(progressPaid, false)
	}
	e.checkFeasible(s)
	return payObs{OK: true, OrderID: id, OrderStatus: o.status, Amount: o.amount, Balance: e.w.balance}
}

func plural(n int64, unit string) string {
	if n == 1 {
		return "1 " + unit
	}
	return strconv.FormatInt(n, 10) + " " + unit + "s"
}

func (e *episode) balance(_ *args, _ *stepState) any {
	return balanceObs{OK: true, Balance: e.w.balance}
}

func (e *episode) ship(a *args, s *stepState) any {
	k, ok := e.order(a.orderID)
	if !ok {
		return e.unknownOrder(a.orderID, s)
	}
	o := &e.orders[k]
	id := orderID(k)
	switch o.status {
	case statusCreated:
		return s.fail(RuleShipBeforePayment, "order not paid", fmt.Sprintf("order %s is not paid", id),
			"pay it with payment.pay first")
	case statusShipped:
		return s.fail(RuleShipOnce, "order already shipped", fmt.Sprintf("order %s is already shipped", id),
			"check order.status before shipping again")
	}
	s.diff.setString("orders/"+id+"/status", o.status, statusShipped)
	o.status = statusShipped
	if e.fulfils(*o) && e.spent <= e.w.task.budget {
		s.reach(progressShipped, false)
		s.success = true
	}
	return shipObs{OK: true, OrderID: id, OrderStatus: o.status}
}

func (e *episode) wait(a *args, _ *stepState) any {
	e.clock += time.Duration(a.ms) * time.Millisecond
	return waitObs{OK: true, WaitedMs: a.ms, ElapsedMs: e.clock.Milliseconds()}
}
