package world

import (
	"errors"
	"fmt"
	"reflect"
	"slices"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
)

// provider declares the world's object types to CEL: one per entity kind (its fields
// and id) and one per tool's arguments. The checker reads the declared field types, which
// is what catches a misspelt field when the world loads; the interpreter reads a field
// of an object by its position (FieldType.GetFrom), without a map lookup or reflection.
type provider struct {
	types.Provider
	objs map[string]*objType
}

func newProvider() (*provider, error) {
	reg, err := types.NewRegistry()
	if err != nil {
		return nil, err
	}
	return &provider{Provider: reg, objs: map[string]*objType{}}, nil
}

// objType is a declared object type: its fields in order, their CEL types, and for
// each field the FieldType the interpreter selects it with.
type objType struct {
	name   string
	typ    *types.Type
	fields []string
	index  map[string]int
	ftypes []*types.FieldType
	// sorted lists the field positions in the order of their names: an object's JSON.
	sorted []int
	// memoSlots numbers the calls that read nothing but arguments of this type
	// (closures.memoize), by their text: set when the world loads.
	memoSlots map[string]int
}

func (p *provider) declare(name string, fields []string, ftypes []*types.Type) *objType {
	t := &objType{name: name, typ: types.NewObjectType(name), fields: fields, index: make(map[string]int, len(fields)),
		ftypes: make([]*types.FieldType, len(fields)), sorted: make([]int, len(fields))}
	for i, f := range fields {
		t.index[f] = i
		t.sorted[i] = i
		t.ftypes[i] = &types.FieldType{Type: ftypes[i], IsSet: isSet, GetFrom: getField(i, f)}
	}
	slices.SortFunc(t.sorted, func(a, b int) int { return cmpString(fields[a], fields[b]) })
	p.objs[name] = t
	return t
}

func isSet(any) bool { return true }

// getField reads field i of an object. A field not set yet is one an entity's draw reads
// before drawing it: an error of the world file, which trial resets report at load.
func getField(i int, name string) func(any) (any, error) {
	return func(obj any) (any, error) {
		o, ok := obj.(*object)
		if !ok || i >= len(o.vals) {
			return nil, fmt.Errorf("no field %s on %T", name, obj)
		}
		if v := o.vals[i]; v != nil {
			return v, nil
		}
		return nil, fmt.Errorf("field %s is read before it is drawn", name)
	}
}

func (p *provider) FindStructType(name string) (*types.Type, bool) {
	if _, ok := p.objs[name]; ok {
		return types.NewTypeTypeWithParam(types.NewObjectType(name)), true
	}
	return p.Provider.FindStructType(name)
}

func (p *provider) FindStructFieldNames(name string) ([]string, bool) {
	if t, ok := p.objs[name]; ok {
		return t.fields, true
	}
	return p.Provider.FindStructFieldNames(name)
}

func (p *provider) FindStructFieldType(name, field string) (*types.FieldType, bool) {
	if t, ok := p.objs[name]; ok {
		i, ok := t.index[field]
		if !ok {
			return nil, false
		}
		return t.ftypes[i], true
	}
	return p.Provider.FindStructFieldType(name, field)
}

func (p *provider) NewValue(name string, fields map[string]ref.Val) ref.Val {
	if _, ok := p.objs[name]; ok {
		return types.NewErr("world objects of type %s are made by the world, not by expressions", name)
	}
	return p.Provider.NewValue(name, fields)
}

// object is an entity or a tool call's arguments as CEL sees it: its field values by
// position (an entity's id first). Values are CEL values already, so reading one
// converts nothing.
type object struct {
	t    *objType
	vals []ref.Val
	// memo holds, for a tool call's arguments, the values of the calls that read only
	// them, by their slot in t.memoSlots: computed once per step, whichever expression
	// of the tool reads them first. Cleared whenever vals change.
	memo []ref.Val
}

var (
	_ ref.Val        = (*object)(nil)
	_ traits.Indexer = (*object)(nil)
)

func newObject(t *objType) *object { return &object{t: t, vals: make([]ref.Val, len(t.fields))} }

func (o *object) ConvertToNative(typeDesc reflect.Type) (any, error) {
	if typeDesc.Kind() == reflect.Map && typeDesc.Key().Kind() == reflect.String {
		m := reflect.MakeMapWithSize(typeDesc, len(o.vals))
		for i, f := range o.t.fields {
			if o.vals[i] == nil {
				continue
			}
			v, err := o.vals[i].ConvertToNative(typeDesc.Elem())
			if err != nil {
				return nil, err
			}
			m.SetMapIndex(reflect.ValueOf(f), reflect.ValueOf(v))
		}
		return m.Interface(), nil
	}
	return nil, fmt.Errorf("type conversion error from %s to %v", o.t.name, typeDesc)
}

func (o *object) ConvertToType(t ref.Type) ref.Val {
	switch t {
	case types.TypeType:
		return o.t.typ
	case o.t.typ:
		return o
	}
	return types.NewErr("type conversion error from %s to %s", o.t.name, t.TypeName())
}

func (o *object) Equal(other ref.Val) ref.Val {
	x, ok := other.(*object)
	if !ok || x.t != o.t {
		return types.False
	}
	for i, v := range o.vals {
		if v == nil || x.vals[i] == nil {
			if v != x.vals[i] {
				return types.False
			}
			continue
		}
		if v.Equal(x.vals[i]) != types.True {
			return types.False
		}
	}
	return types.True
}

func (o *object) Type() ref.Type { return o.t.typ }

// Value is the object itself: the interpreter hands it to FieldType.GetFrom.
func (o *object) Value() any { return o }

// Get selects a field by name (a dyn-typed selection).
func (o *object) Get(key ref.Val) ref.Val {
	k, ok := key.(types.String)
	if !ok {
		return types.ValOrErr(key, "no such overload")
	}
	i, ok := o.t.index[string(k)]
	if !ok || o.vals[i] == nil {
		return types.NewErr("no such key: %s", string(k))
	}
	return o.vals[i]
}

// collection is an entity collection as CEL sees it: a map from id to entity whose
// comprehensions (exists, all, map, filter) visit the entities in the order they were
// made, so that what an expression builds from a collection is the same on every run.
type collection struct {
	ids []string
	// rows finds an entity by its id once the collection holds more than
	// smallCollection (nil until then: row looks through ids).
	rows map[string]*object
	// objs are the entities in ids' order: what a comprehension visits, without a
	// lookup by id.
	objs []*object
}

// smallCollection is the size up to which a collection finds an id by looking through
// its ids rather than in a map: a reset makes no map for its few entities (the shop's
// collections with their maps were 7 of a reset's 95 allocations and 800 of its 9,900
// bytes), and the shop's steps, which look skus up among a dozen, cost no more for it
// (BenchmarkShopWorldReplay, docs/benchmarks.md).
const smallCollection = 16

// put adds an entity (its id set) after the others.
func (m *collection) put(id string, o *object) {
	m.ids = append(m.ids, id)
	m.objs = append(m.objs, o)
	switch {
	case m.rows != nil:
		m.rows[id] = o
	case len(m.ids) > smallCollection:
		m.rows = make(map[string]*object, 2*len(m.ids))
		for i, k := range m.ids {
			m.rows[k] = m.objs[i]
		}
	}
}

// row returns the entity of an id: the last put with it, as the map has it.
func (m *collection) row(id string) (*object, bool) {
	if m.rows != nil {
		o, ok := m.rows[id]
		return o, ok
	}
	for i := len(m.ids) - 1; i >= 0; i-- {
		if m.ids[i] == id {
			return m.objs[i], true
		}
	}
	return nil, false
}

var (
	_ traits.Mapper   = (*collection)(nil)
	_ traits.Foldable = (*collection)(nil)
)

func (m *collection) Contains(key ref.Val) ref.Val {
	_, ok := m.Find(key)
	return types.Bool(ok)
}

// Find returns the entity of an id.
func (m *collection) Find(key ref.Val) (ref.Val, bool) {
	k, ok := key.(types.String)
	if !ok {
		return nil, false
	}
	o, ok := m.row(string(k))
	if !ok {
		return nil, false
	}
	return o, true
}

// Get returns the entity of an id, or CEL's no-such-key error.
func (m *collection) Get(key ref.Val) ref.Val {
	if v, ok := m.Find(key); ok {
		return v
	}
	return types.NewErr("no such key: %v", key)
}

func (m *collection) Size() ref.Val { return types.Int(len(m.ids)) }

// Fold visits the entries in creation order.
func (m *collection) Fold(f traits.Folder) {
	for i, k := range m.ids {
		if !f.FoldEntry(types.String(k), m.objs[i]) {
			return
		}
	}
}

// Iterator visits the keys in creation order.
func (m *collection) Iterator() traits.Iterator { return &keyIter{keys: m.ids} }

func (m *collection) ConvertToNative(typeDesc reflect.Type) (any, error) {
	if typeDesc.Kind() == reflect.Map && typeDesc.Key().Kind() == reflect.String {
		out := reflect.MakeMapWithSize(typeDesc, len(m.ids))
		for _, k := range m.ids {
			o, _ := m.row(k)
			v, err := o.ConvertToNative(typeDesc.Elem())
			if err != nil {
				return nil, err
			}
			out.SetMapIndex(reflect.ValueOf(k), reflect.ValueOf(v))
		}
		return out.Interface(), nil
	}
	return nil, fmt.Errorf("type conversion error from map to %v", typeDesc)
}

func (m *collection) ConvertToType(t ref.Type) ref.Val {
	switch t {
	case types.MapType:
		return m
	case types.TypeType:
		return types.MapType
	}
	return types.NewErr("type conversion error from map to %s", t.TypeName())
}

func (m *collection) Equal(other ref.Val) ref.Val {
	x, ok := other.(traits.Mapper)
	if !ok || x.Size() != m.Size() {
		return types.False
	}
	for _, k := range m.ids {
		v, found := x.Find(types.String(k))
		if o, _ := m.row(k); !found || o.Equal(v) != types.True {
			return types.False
		}
	}
	return types.True
}

func (m *collection) Type() ref.Type { return types.MapType }

func (m *collection) Value() any { return m }

var errNoMore = errors.New("iterator has no more elements")

// keyIter visits a collection's ids.
type keyIter struct {
	keys []string
	i    int
}

func (it *keyIter) HasNext() ref.Val { return types.Bool(it.i < len(it.keys)) }

func (it *keyIter) Next() ref.Val {
	if it.i >= len(it.keys) {
		return types.WrapErr(errNoMore)
	}
	it.i++
	return types.String(it.keys[it.i-1])
}

func (it *keyIter) ConvertToNative(reflect.Type) (any, error) {
	return nil, errors.New("an iterator has no native form")
}
func (it *keyIter) ConvertToType(ref.Type) ref.Val { return types.NewErr("an iterator has no type") }
func (it *keyIter) Equal(ref.Val) ref.Val          { return types.False }
func (it *keyIter) Type() ref.Type                 { return types.IteratorType }
func (it *keyIter) Value() any                     { return it }
