-- 0011 role policies, PostgreSQL: one permissive policy per table and mapped role, TO that
-- role, with a constant predicate, written from schedlock_namespace_roles (0008) by the owner.
--
-- Why: 0008's one policy per table called schedlock_served_namespaces(current_user), a
-- SECURITY DEFINER function with a pinned search_path, as two InitPlans per use; an UPDATE
-- uses a policy for its USING, its WITH CHECK and (with RETURNING) SELECT's USING, so the
-- leader's every statement ran the function two to six times, about 0.3 ms each.  Here a role
-- mapped to namespaces a and b has `USING (namespace = ANY ('{a,b}'::text[]))` (and the same
-- WITH CHECK), a role mapped to a alone `USING (namespace = 'a'::text)` (a plain equality the
-- index scans merge with the statement's own, where `= ANY` costs array keys: ~3 % of a claim),
-- a role mapped to '*' `USING (true)`: planned as constants, nothing runs.
--
-- Same rule as 0008's function (schedlock_role_namespaces): PostgreSQL applies a policy TO R
-- to R and to every role that has R's privileges (a member that inherits them, or one that
-- SET ROLE R), exactly pg_has_role(…, R, 'USAGE'); a NOINHERIT member gets R's policies only
-- after SET ROLE R, as it gets its table privileges.  Roles that bypass row-level security
-- (superusers, BYPASSRLS, the tables' owner and its members) still see everything.  A mapping
-- row whose role does not exist writes no policy (the function answers nothing for it either).
--
-- The mapping stays the only thing the owner changes (`schedlock migrate --grant-… [--namespace
-- NS …] [--only]`): an AFTER STATEMENT trigger on it calls schedlock_apply_role_policies(),
-- which drops the policies of roles no longer mapped (or narrowed) and writes the missing ones,
-- in the same transaction, so the policies cannot disagree with the mapping after any grant,
-- whatever binary wrote it.  A role renamed or dropped and created again changes its oid or
-- name under the mapping: its policies follow at its next grant (which it needs anyway for
-- its table privileges).  CREATE and DROP POLICY take an ACCESS EXCLUSIVE lock on the table:
-- only a change takes it (an unchanged mapping writes nothing), and `migrate --grant-…` waits
-- for it a bounded time (lock_timeout) and tries again, so the sidecars' statements queue
-- behind it for no longer than that.

-- The policies the mapping asks for and the ones there are, as the changes that would make
-- them agree: ('drop', table, policy) for a policy of ours that is not wanted as it stands,
-- ('create', table, policy, role, predicate) for a wanted one that is missing (a changed one
-- is both).  Ours are named schedlock_role_<role oid> (any role name fits a policy name).  A
-- predicate is compared with the server's own rendering of the stored one: a rendering that
-- differs only writes the same policy again.  No row: they agree.
CREATE FUNCTION schedlock_role_policies_drift()
RETURNS TABLE (action text, tab regclass, policy name, role name, predicate text)
LANGUAGE sql STABLE AS $$
    WITH tables AS (
        SELECT unnest(ARRAY['schedlock_publishes', 'schedlock_schedules', 'schedlock_terms',
                            'schedlock_reserves']::regclass[]) AS tab
    ), wanted AS (
        SELECT t.tab, ('schedlock_role_' || r.oid)::name AS policy, r.oid AS role_oid,
               r.rolname AS role,
               CASE WHEN bool_or(m.namespace = '*') THEN 'true'
                    WHEN count(*) = 1 THEN format('(namespace = %L::text)', min(m.namespace))
                    ELSE format('(namespace = ANY (%L::text[]))',
                                array_agg(m.namespace ORDER BY m.namespace)::text)
               END AS predicate
        FROM schedlock_namespace_roles m JOIN pg_roles r ON r.rolname = m.role, tables t
        GROUP BY t.tab, r.oid, r.rolname
    ), present AS (
        SELECT p.polrelid::regclass AS tab, p.polname AS policy,
               EXISTS (SELECT 1 FROM wanted w
                       WHERE w.tab = p.polrelid AND w.policy = p.polname
                         AND p.polpermissive AND p.polcmd = '*' AND p.polroles = ARRAY[w.role_oid]
                         AND pg_get_expr(p.polqual, p.polrelid) = w.predicate
                         AND pg_get_expr(p.polwithcheck, p.polrelid) = w.predicate) AS current
        FROM pg_policy p
        WHERE p.polrelid IN (SELECT tab FROM tables) AND p.polname LIKE 'schedlock\_role\_%'
    )
    SELECT 'drop', p.tab, p.policy, NULL::name, NULL::text FROM present p WHERE NOT p.current
    UNION ALL
    SELECT 'create', w.tab, w.policy, w.role, w.predicate FROM wanted w
    WHERE NOT EXISTS (SELECT 1 FROM present p
                      WHERE p.tab = w.tab AND p.policy = w.policy AND p.current)
$$;

-- Make the policies agree with the mapping; answers how many policies it dropped or created.
-- Nothing to change: no lock taken.  Otherwise the four tables are locked first, always in
-- this order, and the changes computed again under the lock (a concurrent grant may have
-- written them meanwhile).  Run by the owner (CREATE POLICY needs the tables' owner): the
-- mapping's trigger and this migration; EXECUTE is not PUBLIC's.
CREATE FUNCTION schedlock_apply_role_policies() RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    change record;
    changed integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM schedlock_role_policies_drift()) THEN
        RETURN 0;
    END IF;
    LOCK TABLE schedlock_publishes, schedlock_schedules, schedlock_terms, schedlock_reserves
        IN ACCESS EXCLUSIVE MODE;
    FOR change IN SELECT * FROM schedlock_role_policies_drift() d
                  ORDER BY d.action = 'create', d.tab, d.policy LOOP
        IF change.action = 'drop' THEN
            EXECUTE format('DROP POLICY %I ON %s', change.policy, change.tab);
        ELSE
            EXECUTE format('CREATE POLICY %I ON %s AS PERMISSIVE FOR ALL TO %I USING (%s) '
                           'WITH CHECK (%s)', change.policy, change.tab, change.role,
                           change.predicate, change.predicate);
        END IF;
        changed := changed + 1;
    END LOOP;
    RETURN changed;
END
$$;

CREATE FUNCTION schedlock_namespace_roles_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM schedlock_apply_role_policies();
    RETURN NULL;
END
$$;

-- Pinned search_path, as 0008's; EXECUTE is not PUBLIC's.
SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);
ALTER FUNCTION schedlock_role_policies_drift() SET search_path FROM CURRENT;
ALTER FUNCTION schedlock_apply_role_policies() SET search_path FROM CURRENT;
ALTER FUNCTION schedlock_namespace_roles_changed() SET search_path FROM CURRENT;
REVOKE EXECUTE ON FUNCTION schedlock_role_policies_drift(), schedlock_apply_role_policies(),
                           schedlock_namespace_roles_changed() FROM PUBLIC;

-- 0008's function-based policies go; a terms row written by a runtime role must still carry
-- its key's own lock ids (0008's WITH CHECK), now as a restrictive policy on top of the role's
-- own, whoever the role is.
DROP POLICY schedlock_served ON schedlock_publishes;
DROP POLICY schedlock_served ON schedlock_schedules;
DROP POLICY schedlock_served ON schedlock_terms;
DROP POLICY schedlock_served ON schedlock_reserves;
CREATE POLICY schedlock_own_lock_ids ON schedlock_terms AS RESTRICTIVE FOR ALL
    USING (true)
    WITH CHECK (lock_classid = 1396919371
                AND lock_objid = schedlock_lock_objid(
                    'schedlock/v1/' || scheduler || '/' || namespace || '/' || target));

-- Every mapped role's policies, from the mapping as it stands (the roles 0008 mapped to '*' and
-- every grant since), then the trigger that keeps them so.
SELECT schedlock_apply_role_policies();
CREATE TRIGGER schedlock_role_policies
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON schedlock_namespace_roles
    FOR EACH STATEMENT EXECUTE FUNCTION schedlock_namespace_roles_changed();
