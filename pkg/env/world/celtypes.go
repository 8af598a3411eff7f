package world

import (
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
)

// provider declares the world's object types to the CEL type checker: one per entity kind
// (its fields and id) and one per tool's arguments. At run time such objects are plain
// maps, whose fields CEL selects by key; the checker alone needs the declared types, which
// is what catches a misspelt field when the world loads.
type provider struct {
	types.Provider
	structs map[string]map[string]*types.Type
	order   map[string][]string
}

func newProvider() (*provider, error) {
	reg, err := types.NewRegistry()
	if err != nil {
		return nil, err
	}
	return &provider{Provider: reg, structs: map[string]map[string]*types.Type{}, order: map[string][]string{}}, nil
}

func (p *provider) declare(name string, fields []string, ftypes []*types.Type) {
	m := make(map[string]*types.Type, len(fields))
	for i, f := range fields {
		m[f] = ftypes[i]
	}
	p.structs[name] = m
	p.order[name] = fields
}

func (p *provider) FindStructType(name string) (*types.Type, bool) {
	if _, ok := p.structs[name]; ok {
		return types.NewTypeTypeWithParam(types.NewObjectType(name)), true
	}
	return p.Provider.FindStructType(name)
}

func (p *provider) FindStructFieldNames(name string) ([]string, bool) {
	if f, ok := p.order[name]; ok {
		return f, true
	}
	return p.Provider.FindStructFieldNames(name)
}

func (p *provider) FindStructFieldType(name, field string) (*types.FieldType, bool) {
	if m, ok := p.structs[name]; ok {
		t, ok := m[field]
		if !ok {
			return nil, false
		}
		// No IsSet/GetFrom: the interpreter then selects the field from the map value.
		return &types.FieldType{Type: t}, true
	}
	return p.Provider.FindStructFieldType(name, field)
}

func (p *provider) NewValue(name string, fields map[string]ref.Val) ref.Val {
	if _, ok := p.structs[name]; ok {
		return types.NewErr("world objects of type %s are made by the world, not by expressions", name)
	}
	return p.Provider.NewValue(name, fields)
}

// orderedMap is an entity collection as CEL sees it: a map from id to the entity, whose
// comprehensions (exists, all, map, filter) visit the entities in the order they were
// made, so that what an expression builds from a collection is the same on every run.
// Each entity's CEL value is made once and kept (vals) until the entity changes: end
// conditions fold over whole collections after every step that changes the state.
type orderedMap struct {
	traits.Mapper
	keys []string
	vals map[string]ref.Val
}

var _ traits.Foldable = (*orderedMap)(nil)

func newOrderedMap(rows map[string]any, keys []string) *orderedMap {
	return &orderedMap{Mapper: types.DefaultTypeAdapter.NativeToValue(rows).(traits.Mapper), keys: keys, vals: make(map[string]ref.Val, len(keys))}
}

// Find returns the entity of an id, from the kept values.
func (m *orderedMap) Find(key ref.Val) (ref.Val, bool) {
	k, ok := key.(types.String)
	if !ok {
		return m.Mapper.Find(key)
	}
	if v, ok := m.vals[string(k)]; ok {
		return v, true
	}
	v, ok := m.Mapper.Find(key)
	if ok {
		m.vals[string(k)] = v
	}
	return v, ok
}

// Get returns the entity of an id, or CEL's no-such-key error.
func (m *orderedMap) Get(key ref.Val) ref.Val {
	if v, ok := m.Find(key); ok {
		return v
	}
	return m.Mapper.Get(key)
}

// Contains reports whether an id names an entity.
func (m *orderedMap) Contains(key ref.Val) ref.Val { return m.Mapper.Contains(key) }

// changed forgets the kept value of an entity that changed.
func (m *orderedMap) changed(id string) { delete(m.vals, id) }

// Fold visits the entries in creation order.
func (m *orderedMap) Fold(f traits.Folder) {
	for _, k := range m.keys {
		key := types.String(k)
		if !f.FoldEntry(key, m.Get(key)) {
			return
		}
	}
}

// Iterator visits the keys in creation order.
func (m *orderedMap) Iterator() traits.Iterator { return &keyIter{Val: m.Mapper, keys: m.keys} }

type keyIter struct {
	ref.Val
	keys []string
	i    int
}

func (it *keyIter) HasNext() ref.Val { return types.Bool(it.i < len(it.keys)) }

func (it *keyIter) Next() ref.Val {
	if it.i >= len(it.keys) {
		return nil
	}
	it.i++
	return types.String(it.keys[it.i-1])
}
