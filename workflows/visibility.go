package workflows

import (
	"context"
	"errors"
	"fmt"
	"sort"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"
)

// The search attributes curricula set, so that Temporal's UI and `temporal workflow list
// --query` show and filter them (`GauntletCurriculumState = 'paused'`). A namespace must
// have them registered before a workflow may set them: the dev server gauntlet starts
// registers them (temporallocal.Options.SearchAttributes), and `gauntlet curriculum
// start` registers those missing on any server (EnsureSearchAttributes) and tells the
// workflow, in its memo, whether they are there.
var (
	// SearchAttrState is the curriculum's status: running, paused, completed, stopped,
	// skipped or aborted.
	SearchAttrState = temporal.NewSearchAttributeKeyKeyword("GauntletCurriculumState")
	// SearchAttrStage is the index of the stage running (or the last one, once ended).
	SearchAttrStage = temporal.NewSearchAttributeKeyInt64("GauntletStage")
	// SearchAttrStageName is that stage's name.
	SearchAttrStageName = temporal.NewSearchAttributeKeyKeyword("GauntletStageName")
)

// SearchAttributes are the custom search attributes of gauntlet's workflows, by name,
// with their Temporal types as `temporal server start-dev --search-attribute` takes them.
var SearchAttributes = map[string]string{
	SearchAttrState.GetName():     "Keyword",
	SearchAttrStage.GetName():     "Int",
	SearchAttrStageName.GetName(): "Keyword",
}

// Memo fields a curriculum keeps up to date (besides MemoSubmittedBy): what Temporal's UI
// shows on the workflow's page, with no registration needed.
const (
	MemoState     = "state"
	MemoStage     = "stage"
	MemoStageName = "stage_name"
	// MemoPauseReason says why a curriculum paused itself (Progress.PauseReason); empty
	// otherwise.
	MemoPauseReason = "pause_reason"
	// MemoSearchAttributes, set true by the starter, says the namespace has
	// SearchAttributes registered, so the workflow may set them.
	MemoSearchAttributes = "search_attributes"
)

// versionVisibility is the change id under which curricula keep their memo and search
// attributes current and close as canceled when aborted: workflows started before it
// replay as they ran.
const versionVisibility = "visibility-and-abort-as-canceled"

// EnsureSearchAttributes registers in namespace those of SearchAttributes it lacks. It
// returns nil when all are there afterwards; an error (a server that refuses, a client
// without the permission) means the workflow must not set them.
func EnsureSearchAttributes(ctx context.Context, c client.Client, namespace string) error {
	resp, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("list search attributes of namespace %s: %w", namespace, err)
	}
	missing := map[string]enumspb.IndexedValueType{}
	var names []string
	for name, typ := range SearchAttributes {
		if _, ok := resp.GetCustomAttributes()[name]; ok {
			continue
		}
		v, err := enumspb.IndexedValueTypeFromString(typ)
		if err != nil {
			return fmt.Errorf("search attribute %s: %w", name, err)
		}
		missing[name] = v
		names = append(names, name)
	}
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(names)
	if _, err := c.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace: namespace, SearchAttributes: missing,
	}); err != nil {
		return fmt.Errorf("register search attributes %v in namespace %s: %w", names, namespace, err)
	}
	return nil
}

// memoBool reads a boolean memo field of the workflow (false when absent).
func memoBool(ctx workflow.Context, field string) bool {
	m := workflow.GetInfo(ctx).Memo
	if m == nil {
		return false
	}
	p, ok := m.GetFields()[field]
	if !ok {
		return false
	}
	var v bool
	return converter.GetDefaultDataConverter().FromPayload(p, &v) == nil && v
}

// shown is what a curriculum last published to Temporal's visibility.
type shown struct {
	status string
	stage  int
}

// publish sets the memo (and the search attributes, when registered) to the
// curriculum's status and stage, when they changed since last published. A failure is
// logged: what Temporal shows is for people, the curriculum goes on.
func (c *curriculum) publish(ctx workflow.Context) {
	if !c.visible {
		return
	}
	s := c.st
	now := shown{s.Status, s.Stage}
	if c.last != nil && *c.last == now {
		return
	}
	c.last = &now
	stage := min(s.Stage, len(c.spec.Stages)-1)
	name := c.spec.Stages[stage].Name
	log := workflow.GetLogger(ctx)
	memo := map[string]any{MemoState: s.Status, MemoStage: stage, MemoStageName: name}
	if c.infraOut {
		memo[MemoPauseReason] = s.PauseReason
	}
	if err := workflow.UpsertMemo(ctx, memo); err != nil {
		log.Warn("update the curriculum's memo", "err", err)
	}
	if !c.searchAttrs {
		return
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx,
		SearchAttrState.ValueSet(s.Status), SearchAttrStage.ValueSet(int64(stage)), SearchAttrStageName.ValueSet(name)); err != nil {
		log.Warn("update the curriculum's search attributes", "err", err)
	}
}

// ProgressOf returns the progress an aborted curriculum closed with, from the error a
// client's Get of its run returned (the workflow closed as canceled with its progress as
// details); ok is false for any other error.
func ProgressOf(err error) (p Progress, ok bool) {
	var ce *temporal.CanceledError
	if !errors.As(err, &ce) || !ce.HasDetails() {
		return Progress{}, false
	}
	if ce.Details(&p) != nil {
		return Progress{}, false
	}
	return p, true
}
