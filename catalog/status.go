package catalog

import (
	"context"
	"fmt"

	"github.com/tessera-gpu/tessera/catalog/api/v1alpha1"
)

type statusDef struct {
	phase      *expr
	conditions *expr
	typeF      string
	statusF    string
	reasonF    string
	messageF   string
	// mappings in precedence order: the first status with a matching matcher wins.
	mappings []statusMapping
}

type statusMapping struct {
	status   Status
	matchers []matcher
}

type matcher struct {
	phase      string
	conditions []v1alpha1.ExpectedCondition
	expression *expr
	expected   string
}

func compileStatus(sd *v1alpha1.StatusDefinition, field string) (*statusDef, error) {
	s := &statusDef{typeF: "type", statusF: "status", reasonF: "reason", messageF: "message"}
	var err error
	if sd.PhaseDefinition != nil {
		if s.phase, err = compileExpr(sd.PhaseDefinition.Path, field+".phaseDefinition.path"); err != nil {
			return nil, err
		}
	}
	if cd := sd.ConditionsDefinition; cd != nil {
		if s.conditions, err = compileExpr(cd.Path, field+".conditionsDefinition.path"); err != nil {
			return nil, err
		}
		if cd.TypeFieldName != "" {
			s.typeF = cd.TypeFieldName
		}
		if cd.StatusFieldName != "" {
			s.statusF = cd.StatusFieldName
		}
		if cd.ReasonFieldName != nil && *cd.ReasonFieldName != "" {
			s.reasonF = *cd.ReasonFieldName
		}
		if cd.MessageFieldName != nil && *cd.MessageFieldName != "" {
			s.messageF = *cd.MessageFieldName
		}
	}
	m := sd.StatusMappings
	// Terminal and operator-driven states first, so that a failed workload whose
	// Running condition is still true reads as failed.
	order := []struct {
		st Status
		ms []v1alpha1.StatusMatcher
		n  string
	}{
		{StatusFailed, m.Failed, "failed"},
		{StatusCompleted, m.Completed, "completed"},
		{StatusSuspended, m.Suspended, "suspended"},
		{StatusSuspending, m.Suspending, "suspending"},
		{StatusResuming, m.Resuming, "resuming"},
		{StatusDegraded, m.Degraded, "degraded"},
		{StatusRunning, m.Running, "running"},
		{StatusProgressing, m.Progressing, "progressing"},
		{StatusInitializing, m.Initializing, "initializing"},
		{StatusPending, m.Pending, "pending"},
	}
	for _, o := range order {
		var ms []matcher
		for i, sm := range o.ms {
			mt := matcher{phase: sm.ByPhase, conditions: sm.ByConditions}
			if sm.ByExpression != nil {
				f := fmt.Sprintf("%s.statusMappings.%s[%d].byExpression.expression", field, o.n, i)
				if mt.expression, err = compileExpr(sm.ByExpression.Expression, f); err != nil {
					return nil, err
				}
				mt.expected = sm.ByExpression.ExpectedResult
			}
			if mt.phase != "" && s.phase == nil {
				return nil, &Error{Field: fmt.Sprintf("%s.statusMappings.%s[%d].byPhase", field, o.n, i), Err: fmt.Errorf("byPhase needs phaseDefinition")}
			}
			if len(mt.conditions) > 0 && s.conditions == nil {
				return nil, &Error{Field: fmt.Sprintf("%s.statusMappings.%s[%d].byConditions", field, o.n, i), Err: fmt.Errorf("byConditions needs conditionsDefinition")}
			}
			ms = append(ms, mt)
		}
		if len(ms) > 0 {
			s.mappings = append(s.mappings, statusMapping{status: o.st, matchers: ms})
		}
	}
	return s, nil
}

// evaluate returns the common status of obj and the message of the condition that
// decided it. An object without a status has not been reconciled yet: pending.
func (s *statusDef) evaluate(ctx context.Context, obj map[string]any) (Status, string, error) {
	_, hasStatus := obj["status"]
	if s == nil {
		if hasStatus {
			return StatusUnknown, "", nil
		}
		return StatusPending, "", nil
	}
	var phase string
	if s.phase != nil {
		v, err := s.phase.first(ctx, obj)
		if err != nil {
			return "", "", err
		}
		if v != nil {
			phase = fmt.Sprint(v)
		}
	}
	var conds []map[string]any
	if s.conditions != nil {
		vals, err := s.conditions.all(ctx, obj)
		if err != nil {
			return "", "", err
		}
		for _, v := range vals {
			switch x := v.(type) {
			case []any:
				for _, c := range x {
					if cm, ok := c.(map[string]any); ok {
						conds = append(conds, cm)
					}
				}
			case map[string]any:
				conds = append(conds, x)
			}
		}
	}
	for _, mp := range s.mappings {
		for _, m := range mp.matchers {
			ok, msg, err := s.match(ctx, m, obj, phase, conds)
			if err != nil {
				return "", "", err
			}
			if ok {
				return mp.status, msg, nil
			}
		}
	}
	if !hasStatus {
		return StatusPending, "", nil
	}
	return StatusUnknown, "", nil
}

func (s *statusDef) match(ctx context.Context, m matcher, obj map[string]any, phase string, conds []map[string]any) (bool, string, error) {
	if m.phase == "" && len(m.conditions) == 0 && m.expression == nil {
		return false, "", nil
	}
	if m.phase != "" && m.phase != phase {
		return false, "", nil
	}
	var msg string
	for _, want := range m.conditions {
		found := false
		for _, c := range conds {
			if str(c[s.typeF]) != want.Type {
				continue
			}
			if want.Status != nil && str(c[s.statusF]) != *want.Status {
				continue
			}
			if want.Reason != nil && str(c[s.reasonF]) != *want.Reason {
				continue
			}
			found = true
			if msg == "" {
				msg = str(c[s.messageF])
			}
			break
		}
		if !found {
			return false, "", nil
		}
	}
	if m.expression != nil {
		v, err := m.expression.first(ctx, obj)
		if err != nil {
			return false, "", err
		}
		if str(v) != m.expected {
			return false, "", nil
		}
	}
	return true, msg, nil
}

// str renders a jq value as the format compares it: strings as they are, other
// scalars in their JSON form, null as "".
func str(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case bool:
		if x {
			return "true"
		}
		return "false"
	case float64:
		if x == float64(int64(x)) {
			return fmt.Sprintf("%d", int64(x))
		}
		return fmt.Sprint(x)
	default:
		return fmt.Sprint(x)
	}
}
