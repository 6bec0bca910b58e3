/* factory view: a plain-JS front end over the store's paged JSON API (or a static bundle's data files).
 *
 * Routes (the URL hash, so every view has a link):
 *   #/                              runs
 *   #/run/R                         a run: counts, pass rate, task x branch grid
 *   #/run/R/rankings                its stored ranking (and its newest rank plots)
 *   #/run/R/outputs                 what commands wrote from it and recorded: plots, power verdicts, exports, models
 *   #/run/R/output/ID               one of them: a power view, a rank plot, an export's manifest, a model
 *   #/run/R/search/Q                hits in final answers and tool outputs
 *   #/run/R/task/T[/branch/B]       a task's branches side by side, and a diff of two final workspaces
 * Every text from the store is put in the page as text (textContent), never as HTML.
 */
(function () {
  'use strict';

  var bundle = window.factoryBundle || null;
  var SIDE = 4; // branches side by side (ViewData's SIDE_BY_SIDE)
  var LIVE_MS = 3000; // a running run's page refreshes this often
  var app = document.getElementById('app');
  var crumbs = document.getElementById('crumbs');
  var statusLine = document.getElementById('status');
  var navIndex = -1;
  var pager = null; // {prev: fn|null, next: fn|null} for n/p
  var renderToken = 0;

  // ------------------------------------------------------------ data

  function bundleKey(name, params) {
    var names = Object.keys(params).filter(function (k) {
      return params[k] !== null && params[k] !== undefined && params[k] !== '';
    }).sort();
    var parts = names.map(function (k) { return k + '=' + params[k]; });
    return name + (parts.length ? '?' + parts.join('&') : '');
  }

  function loadBundled(key) {
    return new Promise(function (resolve, reject) {
      if (Object.prototype.hasOwnProperty.call(bundle.answers, key)) { resolve(bundle.answers[key]); return; }
      var file = bundle.files[key];
      if (!file) { reject(new Error('not in this bundle (a static copy holds the default pages only): ' + key)); return; }
      var script = document.createElement('script');
      script.src = file;
      script.onload = function () { resolve(bundle.answers[key]); };
      script.onerror = function () { reject(new Error('cannot read ' + file)); };
      document.head.appendChild(script);
    });
  }

  function searchCorpus(params) {
    return loadBundled(bundleKey('corpus', {run: params.run})).then(function (corpus) {
      var needle = String(params.q || '').toLowerCase();
      var hits = [];
      var counts = {final_answer: 0, tool_output: 0};
      if (needle.length >= 2) {
        corpus.entries.forEach(function (entry) {
          var text = entry.text || '';
          var at = text.toLowerCase().indexOf(needle);
          if (at < 0 || counts[entry.place] >= corpus.limit) return;
          counts[entry.place] += 1;
          var start = Math.max(0, at - 80);
          hits.push({task_id: entry.task_id, branch_index: entry.branch_index, place: entry.place, seq: entry.seq,
                     text: (start ? '…' : '') + text.slice(start, start + 160)});
        });
      }
      return {run_id: params.run, q: params.q, hits: hits, limit: corpus.limit, cut: corpus.cut};
    });
  }

  function api(name, params) {
    if (bundle) { return name === 'search' ? searchCorpus(params) : loadBundled(bundleKey(name, params)); }
    var query = Object.keys(params).filter(function (k) {
      return params[k] !== null && params[k] !== undefined && params[k] !== '';
    }).map(function (k) { return encodeURIComponent(k) + '=' + encodeURIComponent(params[k]); }).join('&');
    return fetch('api/' + name + (query ? '?' + query : ''), {headers: {Accept: 'application/json'}})
      .then(function (response) {
        return response.json().then(function (body) {
          if (!response.ok) { throw new Error(body.error || ('HTTP ' + response.status)); }
          return body;
        });
      });
  }

  // ------------------------------------------------------------ DOM helpers

  function h(tag, attrs) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        var v = attrs[k];
        if (v === null || v === undefined || v === false) return;
        if (k === 'text') node.textContent = v;
        else if (k === 'cls') node.className = v;
        else if (k.slice(0, 2) === 'on') node.addEventListener(k.slice(2), v);
        else node.setAttribute(k, v === true ? '' : v);
      });
    }
    for (var i = 2; i < arguments.length; i++) append(node, arguments[i]);
    return node;
  }

  function append(node, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) { child.forEach(function (c) { append(node, c); }); return; }
    node.appendChild(typeof child === 'object' ? child : document.createTextNode(String(child)));
  }

  function enc(s) { return encodeURIComponent(String(s)); }
  function runLink(run) { return '#/run/' + enc(run); }
  function taskLink(run, task) { return runLink(run) + '/task/' + enc(task); }
  function branchLink(run, task, b) { return taskLink(run, task) + '/branch/' + b; }

  function pct(x) { return x === null || x === undefined ? '–' : (100 * x).toFixed(1) + '%'; }
  function num(x, digits) { return x === null || x === undefined ? '–' : Number(x).toFixed(digits === undefined ? 3 : digits); }
  function cost(x) { return x === null || x === undefined ? '–' : '$' + Number(x).toFixed(4); }

  function rateText(r) {
    if (!r || r.rate === null) return 'no verified branches';
    return pct(r.rate) + ' [' + pct(r.low) + ', ' + pct(r.high) + '] (' + r.passed + '/' + r.verified + ')';
  }

  function pre(text, cls) { return h('pre', {cls: cls || null, text: text === null || text === undefined ? '' : String(text)}); }

  function stat(label, value, title) { return h('div', {cls: 'stat', title: title || null}, h('span', {cls: 'label', text: label}), h('span', {cls: 'value', text: String(value)})); }

  function setCrumbs(parts) {
    crumbs.textContent = '';
    parts.forEach(function (p, i) {
      if (i) append(crumbs, ' › ');
      append(crumbs, p[1] ? h('a', {href: p[1], text: p[0]}) : h('span', {text: p[0]}));
    });
  }

  function setStatus(text, isError) {
    statusLine.textContent = text || '';
    statusLine.className = isError ? 'error' : '';
  }

  function pagerBar(data, go) {
    var total = data.total, offset = data.offset, limit = data.limit;
    var prev = offset > 0 ? function () { go(Math.max(0, offset - limit)); } : null;
    var next = offset + limit < total ? function () { go(offset + limit); } : null;
    pager = {prev: prev, next: next};
    return h('div', {cls: 'pager'},
      h('button', {type: 'button', disabled: !prev, onclick: prev || null, text: '‹ prev (p)'}),
      h('span', {text: (total ? offset + 1 : 0) + '–' + Math.min(total, offset + limit) + ' of ' + total}),
      h('button', {type: 'button', disabled: !next, onclick: next || null, text: 'next (n) ›'}));
  }

  // ------------------------------------------------------------ runs

  var runsState = {offset: 0, status: '', model: '', q: ''};

  function viewRuns() {
    setCrumbs([['runs', null]]);
    var token = renderToken;
    var params = {offset: runsState.offset || null, status: runsState.status, model: runsState.model, q: runsState.q};
    return api('runs', params).then(function (data) {
      if (token !== renderToken) return;
      var filters = h('form', {cls: 'filters', onsubmit: function (e) { e.preventDefault(); }},
        h('label', null, 'status ', select('status', data.filters.statuses)),
        h('label', null, 'model ', select('model', data.filters.models)),
        h('label', null, 'run or task file ', h('input', {type: 'search', id: 'search', value: runsState.q,
          placeholder: 'filter…', onchange: function (e) { runsState.q = e.target.value; runsState.offset = 0; route(); }})));
      if (bundle) filters = h('p', {cls: 'muted', text: 'static bundle: filters need the server (factory view)'});
      var rows = data.runs.map(function (r) {
        return h('tr', {'data-nav': runLink(r.run_id)},
          h('td', null, h('a', {href: runLink(r.run_id), text: r.run_id})),
          h('td', {text: (r.created_at || '').replace('T', ' ').slice(0, 19)}),
          h('td', null, h('span', {cls: 'badge ' + r.status, text: r.status})),
          h('td', {text: r.model || ''}),
          h('td', {cls: 'n', text: r.branches}),
          h('td', {text: rateText(r.pass_rate)}),
          h('td', {cls: 'n', text: r.infra_failures}),
          h('td', {cls: 'n', text: r.hacks}),
          h('td', {cls: 'n', text: r.boundary_limited}),
          h('td', {cls: 'n', text: cost(r.cost_usd)}));
      });
      app.textContent = '';
      append(app, [h('h1', {text: 'Runs'}), filters,
        data.runs.length ? h('table', {cls: 'list', id: 'runs'},
          h('thead', null, h('tr', null, ['run', 'created (UTC)', 'status', 'model', 'branches',
            'pass rate [95% Wilson]', 'infra failures', 'hacks', 'boundary-limited', 'cost'].map(function (t) { return h('th', {text: t}); }))),
          h('tbody', null, rows)) : h('p', {cls: 'muted', text: 'no runs match'}),
        pagerBar(data, function (o) { runsState.offset = o; route(); })]);
    });

    function select(name, values) {
      return h('select', {name: name, onchange: function (e) { runsState[name] = e.target.value; runsState.offset = 0; route(); }},
        [h('option', {value: '', text: 'any'})].concat(values.map(function (v) {
          return h('option', {value: v, text: v, selected: runsState[name] === v});
        })));
    }
  }

  // ------------------------------------------------------------ a run

  var tasksState = {run: null, offset: 0, q: ''};

  function cellClass(c) {
    if (c.status === 'infra_error' || c.status === 'error') return 'cell infra';
    if (!c.has_verdict) return 'cell unverified';
    if (c.objective_pass === null) return 'cell verror';
    return 'cell ' + (c.objective_pass ? 'pass' : 'fail');
  }

  function cellTitle(task, c) {
    var parts = [task + ' #' + c.branch_index, c.status];
    if (c.has_verdict) parts.push(c.objective_pass === null ? 'verifier error' : (c.objective_pass ? 'pass' : 'fail'));
    if (c.objective_score !== null) parts.push('score ' + num(c.objective_score, 2));
    if (c.judge_score !== null) parts.push('judge ' + num(c.judge_score, 1));
    if (c.hack_detected) parts.push('HACK DETECTED');
    else if (c.hack_suspected) parts.push('hack suspected');
    if (c.boundary_limited) parts.push('boundary-limited');
    if (c.rank !== null) parts.push('rank ' + c.rank);
    return parts.join(' · ');
  }

  function viewRun(run) {
    if (tasksState.run !== run) tasksState = {run: run, offset: 0, q: ''};
    setCrumbs([['runs', '#/'], [run, null]]);
    var token = renderToken;
    return Promise.all([api('run', {run: run}), api('tasks', {run: run, offset: tasksState.offset || null, q: tasksState.q}),
      api('outputs', {run: run})])
      .then(function (answers) {
        if (token !== renderToken) return;
        var r = answers[0], t = answers[1], o = answers[2];
        var statuses = Object.keys(r.by_status).map(function (s) { return s + ' ' + r.by_status[s]; }).join(', ');
        var summary = h('section', {cls: 'summary', id: 'run-summary'},
          stat('status', r.status), stat('model', r.model || '–'), stat('sandbox', r.sandbox || '–'),
          stat('tasks', r.tasks), stat('branches', r.branches, statuses),
          stat('pass rate [95% Wilson]', rateText(r.pass_rate), 'passed of verified outcomes; infrastructure failures and verifier errors left out'),
          stat('infrastructure failures', r.infra_failures, 'branches that are not outcomes (provider, sandbox): excluded from every rate'),
          stat('verifier errors', r.verifier_errors, 'an objective verifier could not judge: no outcome'),
          stat('unverified', r.unverified), stat('max turns', r.max_turns),
          stat('hacks detected', r.hacks), stat('hacks suspected', r.suspected, 'the monitor suspects, no verifier detected'),
          stat('boundary-limited', r.boundary_limited, 'a test failed only because something could not cross the isolation boundary'),
          stat('tokens in/out', r.input_tokens + ' / ' + r.output_tokens), stat('cost', cost(r.cost_usd)),
          stat('ranked rows', r.ranked_rows));
        var searchBox = h('form', {cls: 'filters', onsubmit: function (e) {
          e.preventDefault();
          var q = document.getElementById('search').value.trim();
          if (q) location.hash = runLink(run) + '/search/' + enc(q);
        }}, h('label', null, 'search answers and tool outputs ', h('input', {type: 'search', id: 'search', placeholder: 'text…'})),
          h('button', {type: 'submit', text: 'search'}),
          h('a', {href: runLink(run) + '/rankings', cls: 'button', text: 'ranking'}),
          bundle ? null : h('label', null, ' tasks ', h('input', {type: 'search', id: 'task-filter', value: tasksState.q, placeholder: 'filter tasks…',
            onchange: function (e) { tasksState.q = e.target.value; tasksState.offset = 0; route(); }})));
        var rows = t.tasks.map(function (task) {
          return h('tr', {'data-nav': taskLink(run, task.task_id)},
            h('td', null, h('a', {href: taskLink(run, task.task_id), text: task.task_id})),
            h('td', {cls: 'rate', text: rateText(task.pass_rate)}),
            h('td', {cls: 'cells'}, task.cells.map(function (c) {
              var mark = c.hack_detected ? '!' : (c.hack_suspected ? '?' : (c.boundary_limited ? 'b' : ''));
              return h('a', {cls: cellClass(c) + (c.hack_detected ? ' hack' : c.hack_suspected ? ' suspect' : ''),
                href: branchLink(run, task.task_id, c.branch_index), title: cellTitle(task.task_id, c),
                'data-branch': c.branch_index, text: mark || String(c.branch_index)});
            })));
        });
        app.textContent = '';
        if (r.status === 'running' && !bundle) {
          // a run being forked: show branches as they land (counts are recounted only when the run changed)
          var hash = location.hash;
          setTimeout(function () {
            var typing = document.activeElement && /INPUT|SELECT/.test(document.activeElement.tagName);
            if (token === renderToken && location.hash === hash && !typing) route();
          }, LIVE_MS);
        }
        append(app, [h('h1', {text: 'Run ' + r.run_id + (r.status === 'running' && !bundle ? ' (live: refreshes every ' + LIVE_MS / 1000 + ' s)' : '')}), summary,
          outputsSection(run, o),
          searchBox,
          h('div', {cls: 'legend'}, 'cells: ', h('span', {cls: 'cell pass', text: '0'}), ' pass ', h('span', {cls: 'cell fail', text: '0'}), ' fail ',
            h('span', {cls: 'cell verror', text: '0'}), ' verifier error ', h('span', {cls: 'cell infra', text: '0'}), ' infrastructure failure ',
            h('span', {cls: 'cell unverified', text: '0'}), ' unverified · ! hack detected · ? hack suspected · b boundary-limited'),
          h('table', {cls: 'list grid', id: 'grid'}, h('thead', null, h('tr', null, h('th', {text: 'task'}), h('th', {text: 'pass rate [95% Wilson]'}), h('th', {text: 'branches'}))),
            h('tbody', null, rows)),
          pagerBar(t, function (o) { tasksState.offset = o; route(); })]);
      });
  }

  function viewRankings(run) {
    setCrumbs([['runs', '#/'], [run, runLink(run)], ['ranking', null]]);
    var token = renderToken;
    var state = viewRankings.state && viewRankings.state.run === run ? viewRankings.state : (viewRankings.state = {run: run, offset: 0});
    return api('rankings', {run: run, offset: state.offset || null}).then(function (data) {
      if (token !== renderToken) return;
      app.textContent = '';
      append(app, [h('h1', {text: 'Ranking of ' + run}),
        data.plots.length ? h('div', {cls: 'plots', id: 'rank-plots'}, data.plots.map(function (a) {
          return h('figure', null, a.image ? plotImage(a.image, 'rank plot') : h('p', {cls: 'muted', text: 'plot ' + STATUS_TEXT[a.status]}),
            h('figcaption', null, h('a', {href: outputLink(run, a.artifact_id), text: 'factory rank --plot, ' + when(a.created_at)}), ' ', statusBadge(a.status)));
        })) : null,
        data.total ? h('table', {cls: 'list', id: 'rankings'}, h('thead', null, h('tr', null,
          ['task', 'branch', 'rank', 'strength [95% CI]', 'reward', 'components'].map(function (x) { return h('th', {text: x}); }))),
          h('tbody', null, data.rankings.map(function (row) {
            return h('tr', {'data-nav': branchLink(run, row.task_id, row.branch_index)},
              h('td', null, h('a', {href: taskLink(run, row.task_id), text: row.task_id})),
              h('td', null, h('a', {href: branchLink(run, row.task_id, row.branch_index), text: '#' + row.branch_index})),
              h('td', {cls: 'n', text: row.rank}),
              h('td', {text: num(row.strength) + ' [' + num(row.ci_low) + ', ' + num(row.ci_high) + ']'}),
              h('td', {cls: 'n', text: num(row.reward)}),
              h('td', null, pre(JSON.stringify(row.components), 'small')));
          }))) : h('p', {cls: 'muted', text: 'this run has no stored ranking: factory rank (or factory export) writes one'}),
        data.total ? pagerBar(data, function (o) { state.offset = o; route(); }) : null]);
    });
  }

  // ------------------------------------------------------------ outputs: plots, power verdicts, exports, models

  var KIND_NAMES = {rank_plot: 'rank plot', power: 'power', 'export': 'export', model: 'model'};
  var STATUS_TEXT = {matches: 'file matches', changed: 'changed since recorded', missing: 'missing', 'no file': 'no file'};

  function outputLink(run, id) { return runLink(run) + '/output/' + enc(id); }
  function when(t) { return (t || '').replace('T', ' ').slice(0, 19); }
  function statusBadge(status) { return h('span', {cls: 'badge file-' + status.replace(' ', '-'), 'data-status': status, text: STATUS_TEXT[status] || status}); }

  function outputSummary(a) {
    var m = a.meta || {};
    if (a.kind === 'power') return m.verdict || '';
    if (a.kind === 'rank_plot') {
      var seen = (m.stats || {}).outcomes || {};
      return (m.branches || 0) + ' branches of ' + (m.tasks || 0) + ' tasks ranked' + (seen.verified ? '; ' + seen.passed + '/' + seen.verified + ' pass' : '');
    }
    if (a.kind === 'export') return (m.rows === null || m.rows === undefined ? '?' : m.rows) + ' ' + m.format + ' rows';
    if (a.kind === 'model') {
      var x = m.metrics || {};
      return m.trainer + ': ' + (x.steps || 0) + ' steps, loss ' + num(x.first_loss) + ' → ' + num(x.last_loss);
    }
    return '';
  }

  function outputsTable(run, outputs) {
    return h('table', {cls: 'list', id: 'outputs'}, h('thead', null, h('tr', null,
      ['kind', 'recorded (UTC)', 'path', 'file', 'summary'].map(function (x) { return h('th', {text: x}); }))),
      h('tbody', null, outputs.map(function (a) {
        return h('tr', {'data-nav': outputLink(run, a.artifact_id), 'data-kind': a.kind, 'data-artifact': a.artifact_id},
          h('td', null, h('a', {href: outputLink(run, a.artifact_id), text: KIND_NAMES[a.kind] || a.kind})),
          h('td', {text: when(a.created_at)}),
          h('td', null, h('code', {cls: 'small', text: a.path || '(no file)'})),
          h('td', null, statusBadge(a.status)),
          h('td', {text: outputSummary(a)}));
      })));
  }

  function outputsSection(run, o) {
    return h('section', {cls: 'outputs', id: 'run-outputs'}, h('h2', {text: 'Outputs (' + o.total + ')'}),
      o.total ? outputsTable(run, o.outputs) : h('p', {cls: 'muted', text: 'nothing recorded yet: factory rank --plot, factory power, factory export and factory train record what they write here'}),
      o.total > o.outputs.length ? h('a', {href: runLink(run) + '/outputs', text: 'all ' + o.total + ' outputs'}) : null);
  }

  function viewOutputs(run) {
    setCrumbs([['runs', '#/'], [run, runLink(run)], ['outputs', null]]);
    var token = renderToken;
    var state = viewOutputs.state && viewOutputs.state.run === run ? viewOutputs.state : (viewOutputs.state = {run: run, offset: 0});
    return api('outputs', {run: run, offset: state.offset || null}).then(function (data) {
      if (token !== renderToken) return;
      app.textContent = '';
      append(app, [h('h1', {text: 'Outputs of ' + run}), outputsTable(run, data.outputs),
        pagerBar(data, function (o) { state.offset = o; route(); })]);
    });
  }

  function plotImage(name, alt) {
    return h('img', {cls: 'plot', src: 'files/' + name, alt: alt});
  }

  function facts(rows) {
    return h('table', {cls: 'facts-table'}, h('tbody', null, rows.filter(function (r) { return r; }).map(function (r) {
      return h('tr', null, h('th', {text: r[0]}), h('td', null, r[1]));
    })));
  }

  function filesTable(a) {
    var rows = [{role: KIND_NAMES[a.kind] === 'model' ? 'output folder' : 'file', path: a.path, sha256: a.sha256, status: a.status}].concat(a.files);
    return h('table', {cls: 'list', id: 'output-files'}, h('thead', null, h('tr', null,
      ['file', 'path', 'recorded sha256', 'now'].map(function (x) { return h('th', {text: x}); }))),
      h('tbody', null, rows.map(function (f) {
        return h('tr', {'data-role': f.role}, h('td', {text: f.role}), h('td', null, h('code', {cls: 'small', text: f.path || '(no file)'})),
          h('td', null, h('code', {cls: 'small', text: f.sha256 || '–'})), h('td', null, statusBadge(f.status)));
      })));
  }

  function powerBlock(a) {
    var m = a.meta;
    var arms = [[m.arm_a, m.k_a, m.rate_a, m.ci_a], [m.arm_b, m.k_b, m.rate_b, m.ci_b]];
    var needed = m.tasks_needed - m.n;
    return h('section', {id: 'power'},
      h('p', {cls: 'verdict-line ' + (m.evidence ? 'yes' : 'no'), id: 'power-verdict', text: m.verdict}),
      h('table', {cls: 'list', id: 'power-arms'}, h('thead', null, h('tr', null,
        ['arm', 'passed', 'pass rate [' + Math.round(100 * (1 - m.alpha)) + '% Wilson]'].map(function (x) { return h('th', {text: x}); }))),
        h('tbody', null, arms.map(function (x) {
          return h('tr', null, h('td', {text: x[0]}), h('td', {cls: 'n', text: x[1] + '/' + m.n}),
            h('td', {text: pct(x[2]) + ' [' + pct(x[3][0]) + ', ' + pct(x[3][1]) + ']'}));
        }))),
      facts([
        ['effect (B − A)', m.delta_pp === null ? '–' : (m.delta_pp > 0 ? '+' : '') + m.delta_pp.toFixed(1) + ' pp'],
        ['discordant pairs', m.b + ' (' + m.arm_a + ' only) / ' + m.c + ' (' + m.arm_b + ' only)'],
        ['McNemar exact p', m.p_value === null ? 'n/a (fewer than 4 pairs)' : String(Number(m.p_value.toPrecision(4)))],
        ['min detectable difference', m.min_detectable_delta_pp === null ? 'n/a' : m.min_detectable_delta_pp.toFixed(1) + ' pp'],
        ['powered / significant', (m.powered ? 'powered' : 'not powered') + ' / ' + (m.significant ? 'significant' : 'not significant')],
        ['tasks needed', m.tasks_needed + ' paired tasks to detect ' + m.target_delta_pp.toFixed(1) + ' pp (' + m.n + ' now' + (needed > 0 ? ', about ' + needed + ' more' : ', enough') + ')'],
        m.selection ? ['arms chosen', JSON.stringify(m.selection)] : null,
        ['runs', (m.runs || []).join(', ') + (m.by ? ' by ' + m.by : '')]]));
  }

  function rankBlock(a) {
    var m = a.meta, stats = m.stats || {}, seen = stats.outcomes || {};
    var ci = seen.pass_rate_ci || [null, null];
    return h('section', {id: 'rank-summary'}, facts([
      ['ranked', m.branches + ' branches of ' + m.tasks + ' tasks (' + m.bootstrap + ' bootstrap rounds)'],
      ['outcomes', seen.verified === undefined ? '–' : seen.passed + '/' + seen.verified + ' pass, ' + pct(seen.pass_rate) + ' [' + pct(ci[0]) + ', ' + pct(ci[1]) + ']'],
      ['usable tasks', seen.usable_tasks === undefined ? '–' : seen.usable_tasks + ' of ' + seen.n_tasks + ' (' + seen.usable_pairs + ' pairs)'],
      ['evidence', stats.test === null || stats.test === undefined ? 'no test: ' + (stats.reason || '') : (stats.evidence ? 'evidence: ' : 'not evidence: ') + (stats.verdict || '')],
      m.infra_failures ? ['infrastructure failures', String(m.infra_failures)] : null]),
      h('a', {href: runLink(a.run_id) + '/rankings', text: 'the stored ranking'}));
  }

  function exportBlock(a) {
    var m = a.meta, man = m.manifest || {};
    var counts = man.counts || {};
    return h('section', {id: 'export-manifest'}, facts([
      ['format', man.format + (man.trainer ? ' (for ' + man.trainer + ')' : '') + (man.conversational === false ? ', standard' : ', conversational')],
      ['rows', String(man.rows)],
      man.strategy ? ['pair strategy', man.strategy] : null,
      ['file sha256', h('code', {cls: 'small', text: man.file_sha256 || '–'})],
      ['dataset hash', h('code', {cls: 'small', text: man.dataset_hash || (man.dataset_hashes || []).join(', ') || '–'})],
      ['config hashes', h('code', {cls: 'small', text: (man.config_hashes || []).join(', ') || '–'})],
      ['options hash', h('code', {cls: 'small', text: man.options_hash || '–'})],
      ['runs', (man.run_ids || []).join(', ')],
      ['powered / evidence', String(man.powered) + ' / ' + String(man.evidence)],
      (man.evidence_tests || []).length ? ['evidence tests', h('ul', null, man.evidence_tests.map(function (t) { return h('li', {text: t}); }))] : null,
      ['written by', 'factory ' + (man.factory_version || '?') + (man.git_sha ? ' @ ' + man.git_sha.slice(0, 12) : '') + ', ' + when(man.created_at)]]),
      h('h3', {text: 'counts'}),
      h('table', {cls: 'list', id: 'export-counts'}, h('tbody', null, Object.keys(counts).map(function (k) {
        return h('tr', null, h('td', {text: k}), h('td', {cls: 'n', text: typeof counts[k] === 'object' ? JSON.stringify(counts[k]) : String(counts[k])}));
      }))),
      a.card_text !== undefined ? h('details', {id: 'dataset-card'}, h('summary', {text: 'dataset card'}), pre(a.card_text, 'small')) : null,
      h('details', null, h('summary', {text: 'the whole manifest'}), pre(JSON.stringify(man, null, 2), 'small')));
  }

  function modelBlock(a) {
    var m = a.meta, x = m.metrics || {}, d = m.data || {};
    return h('section', {id: 'model-summary'}, facts([
      ['trainer', m.trainer],
      ['steps', x.steps + ' in ' + num(x.train_seconds, 1) + ' s'],
      ['loss', num(x.first_loss) + ' → ' + num(x.last_loss) + ' (train loss ' + num(x.train_loss) + ')'],
      x.last_reward !== undefined ? ['reward', num(x.first_reward) + ' → ' + num(x.last_reward)] : null,
      ['model', h('code', {cls: 'small', text: m.model_dir || '–'})],
      m.adapter_dir ? ['adapter', h('code', {cls: 'small', text: m.adapter_dir})] : null,
      ['data', (d.rows === undefined ? '?' : d.rows) + ' rows of ' + (d.file || '?') + ', dataset ' + (d.dataset_hash || 'unknown')],
      (m.warnings || []).length ? ['warnings', h('ul', null, m.warnings.map(function (w) { return h('li', {text: w}); }))] : null]));
  }

  function viewOutput(run, id) {
    setCrumbs([['runs', '#/'], [run, runLink(run)], ['outputs', runLink(run) + '/outputs'], [id.slice(0, 8), null]]);
    var token = renderToken;
    return api('output', {run: run, id: id}).then(function (a) {
      if (token !== renderToken) return;
      var body = a.kind === 'power' ? powerBlock(a) : a.kind === 'rank_plot' ? rankBlock(a) : a.kind === 'export' ? exportBlock(a) : a.kind === 'model' ? modelBlock(a) : null;
      var images = (a.image ? [plotImage(a.image, KIND_NAMES[a.kind] + ' plot')] : []).concat(a.files.filter(function (f) { return f.image; }).map(function (f) { return plotImage(f.image, f.role); }));
      var unshown = a.path && /\.png$/i.test(a.path) && !a.image ? h('p', {cls: 'muted', id: 'plot-unshown', text: 'plot not shown: the file is ' + STATUS_TEXT[a.status]}) : null;
      app.textContent = '';
      append(app, [h('h1', {text: (KIND_NAMES[a.kind] || a.kind) + ' · ' + run}),
        h('p', {cls: 'muted', text: 'recorded ' + when(a.created_at) + ' UTC'}),
        body, images.length ? h('div', {cls: 'plots'}, images) : null, unshown,
        h('h2', {text: 'Files'}), filesTable(a)]);
    });
  }

  function viewSearch(run, q) {
    setCrumbs([['runs', '#/'], [run, runLink(run)], ['search: ' + q, null]]);
    var token = renderToken;
    return api('search', {run: run, q: q}).then(function (data) {
      if (token !== renderToken) return;
      app.textContent = '';
      append(app, [h('h1', {text: 'Search ' + run + ' for “' + q + '”'}),
        h('p', {cls: 'muted', text: data.hits.length + ' hits (at most ' + data.limit + ' in final answers and ' + data.limit + ' in tool outputs)'}),
        h('ol', {cls: 'hits', id: 'hits'}, data.hits.map(function (hit) {
          return h('li', {'data-nav': branchLink(run, hit.task_id, hit.branch_index)},
            h('a', {href: branchLink(run, hit.task_id, hit.branch_index), text: hit.task_id + ' #' + hit.branch_index}),
            h('span', {cls: 'badge', text: hit.place === 'final_answer' ? 'final answer' : 'tool output (event ' + hit.seq + ')'}),
            pre(hit.text, 'small'));
        }))]);
    });
  }

  // ------------------------------------------------------------ a task, side by side

  function verdictBlock(v) {
    var d = v.details || {};
    var parts = [h('div', {cls: 'vhead'}, h('span', {cls: 'badge ' + v.status, text: v.status}), ' ',
      h('b', {text: v.verifier}), ' ', h('span', {cls: 'muted', text: 'v' + v.version + ' · score ' + num(v.score, 2)}))];
    var facts = [];
    if (d.isolation || d.method) facts.push('isolation: ' + [d.method, d.isolation].filter(Boolean).join(' / '));
    if (d.passed !== undefined && d.total !== undefined) facts.push('tests passed ' + d.passed + '/' + d.total);
    if (d.code) facts.push('answer code: ' + d.code);
    if (d.got !== undefined) facts.push('got: ' + d.got);
    if (d.expected !== undefined) facts.push('expected: ' + d.expected);
    if (d.exit_code !== undefined) facts.push('exit code ' + d.exit_code);
    if (d.hack_detected) facts.push('HACK DETECTED');
    if (d.hack_suspected) facts.push('hack suspected');
    if (facts.length) parts.push(h('ul', {cls: 'facts'}, facts.map(function (f) { return h('li', {text: f}); })));
    if (d.hacks && d.hacks.length) parts.push(h('div', {cls: 'hacks'}, h('b', {text: 'hacks: '}), d.hacks.map(function (x) { return (x.code || '') + (x.file ? ' (' + x.file + ')' : '') + ' '; })));
    var failures = d.failures || {};
    (d.failed || []).forEach(function (name) {
      parts.push(h('details', {cls: 'failure', open: true}, h('summary', {text: 'failed: ' + name}), failures[name] ? pre(failures[name], 'small') : null));
    });
    (d.collection_errors || []).forEach(function (e) { parts.push(pre('collection error: ' + (typeof e === 'string' ? e : JSON.stringify(e)), 'small')); });
    if (d.boundary && d.boundary.length) parts.push(h('div', {cls: 'boundary'}, h('b', {text: 'boundary-limited: '}), JSON.stringify(d.boundary)));
    if (d.monitor_findings && d.monitor_findings.length) {
      parts.push(h('div', {cls: 'monitor'}, h('b', {text: 'monitor evidence (v' + (d.monitor_version || '?') + '):'}),
        h('ul', null, d.monitor_findings.map(function (f) {
          return h('li', {text: f.code + ' · ' + (f.severity || '') + ' · ' + (f.file || '') + (f.line ? ':' + f.line : '') + ' — ' + (f.evidence || '')});
        }))));
    }
    if (d.samples && d.samples.length) {
      var scores = d.samples.map(function (s) { return s.score; }).filter(function (s) { return s !== null && s !== undefined; });
      var spread = scores.length ? (Math.max.apply(null, scores) - Math.min.apply(null, scores)) : null;
      parts.push(h('div', {cls: 'samples'}, h('b', {text: 'judge samples (' + d.samples.length + ', spread ' + (spread === null ? '–' : spread.toFixed(1)) + '):'}),
        h('ul', null, d.samples.map(function (s) {
          return h('li', {text: '#' + s.sample_index + ' ' + s.status + ' score ' + (s.score === null ? '–' : s.score) + ' — ' + (s.reason || '')});
        }))));
    }
    var shown = ['isolation', 'method', 'passed', 'total', 'code', 'got', 'expected', 'exit_code', 'hack_detected', 'hack_suspected', 'hacks',
      'failed', 'failures', 'collection_errors', 'boundary', 'monitor_findings', 'monitor_version', 'samples'];
    var rest = {};
    Object.keys(d).forEach(function (k) { if (shown.indexOf(k) < 0) rest[k] = d[k]; });
    if (Object.keys(rest).length) parts.push(h('details', null, h('summary', {text: 'all details'}), pre(JSON.stringify(rest, null, 2), 'small')));
    return h('div', {cls: 'verdict verdict-' + v.status, 'data-verifier': v.verifier}, parts);
  }

  function argumentsBlock(args) {
    // multi-line text (a file's content) reads best as it is, not as a JSON string full of \n
    return h('div', {cls: 'args'}, Object.keys(args).map(function (k) {
      var v = args[k];
      var text = typeof v === 'string' ? v : JSON.stringify(v, null, 2);
      return typeof v === 'string' && v.indexOf('\n') < 0 && v.length < 120
        ? h('div', {cls: 'arg'}, h('span', {cls: 'muted', text: k + ': '}), h('code', {text: v}))
        : h('div', {cls: 'arg'}, h('span', {cls: 'muted', text: k + ':'}), pre(text, 'small'));
    }));
  }

  function eventBlock(e) {
    var p = e.payload || {};
    switch (e.kind) {
      case 'run_start':
        return h('details', {cls: 'ev start'}, h('summary', {text: 'start · ' + p.mode + ' · temperature ' + p.temperature + ' · seed ' + p.seed}),
          pre(p.system_prompt, 'small'), p.primer ? pre('primer: ' + p.primer, 'small') : null);
      case 'model_call':
        return h('div', {cls: 'ev model'}, h('div', {cls: 'turn', text: 'turn ' + p.turn + ' · ' + p.output_tokens + ' tokens out'}),
          p.text ? pre(p.text) : null);
      case 'tool_call':
        return h('div', {cls: 'ev call'}, h('b', {text: '→ ' + p.name}), p.error ? h('span', {cls: 'err', text: ' ' + p.error}) : null,
          argumentsBlock(p.arguments || {}));
      case 'tool_result':
        return h('div', {cls: 'ev result ' + (p.ok ? 'ok' : 'notok')}, h('b', {text: '← ' + p.name + (p.ok ? '' : ' (failed)')}), pre(p.output, 'small'));
      case 'final_answer':
        return h('div', {cls: 'ev final'}, h('b', {text: 'final answer (' + p.via + ')'}), pre(p.answer));
      case 'error':
        return h('div', {cls: 'ev error'}, h('b', {text: 'error: ' + p.type}), pre(p.message, 'small'));
      case 'judge_call':
        return h('div', {cls: 'ev judge'}, h('b', {text: 'judge sample ' + p.sample_index + ': ' + p.status + ' ' + (p.score === null ? '' : p.score)}), pre(p.reason, 'small'));
      default:
        return h('div', {cls: 'ev'}, h('b', {text: e.kind}), pre(JSON.stringify(p), 'small'));
    }
  }

  function branchColumn(run, taskId, b, focus) {
    var hack = b.verdicts.some(function (v) { return v.details && v.details.hack_detected; });
    var suspect = b.verdicts.some(function (v) { return v.details && v.details.hack_suspected; });
    var objective = b.verdicts.filter(function (v) { return v.verifier !== 'judge'; });
    var outcome = !objective.length ? 'unverified' : objective.some(function (v) { return v.status === 'error'; }) ? 'verror'
      : objective.every(function (v) { return v.status === 'pass'; }) ? 'pass' : 'fail';
    if (b.status === 'infra_error' || b.status === 'error') outcome = 'infra';
    var head = h('div', {cls: 'bhead ' + outcome, 'data-nav': branchLink(run, taskId, b.branch_index)},
      h('a', {href: branchLink(run, taskId, b.branch_index), cls: 'bname', text: 'branch #' + b.branch_index}), ' ',
      h('span', {cls: 'badge', text: b.status}), ' ', h('span', {cls: 'badge outcome ' + outcome, text: outcome === 'verror' ? 'verifier error' : outcome}),
      hack ? h('span', {cls: 'badge hack', text: 'hack detected'}) : null,
      !hack && suspect ? h('span', {cls: 'badge suspect', text: 'hack suspected'}) : null,
      h('div', {cls: 'muted small', text: 'T=' + b.temperature + ' · seed ' + b.seed + ' · ' + (b.output_tokens || 0) + ' tokens out · ' + cost(b.cost_usd)}),
      b.rank !== null ? h('div', {cls: 'rankline', text: 'rank ' + b.rank + ' · reward ' + num(b.reward) + ' · strength ' + num(b.strength) + ' [' + num(b.ci_low) + ', ' + num(b.ci_high) + ']'}) : h('div', {cls: 'muted small', text: 'not ranked'}),
      b.error ? pre(b.error, 'small err') : null);
    return h('section', {cls: 'branch' + (focus ? ' focus' : ''), id: 'branch-' + b.branch_index, 'data-branch': b.branch_index},
      head,
      h('h3', {text: 'final answer'}), pre(b.final_answer === null ? '(none)' : b.final_answer, 'final-answer'),
      h('h3', {text: 'verdicts'}), b.verdicts.length ? b.verdicts.map(verdictBlock) : h('p', {cls: 'muted', text: 'no verdicts'}),
      h('h3', {text: 'trajectory (' + b.events_total + ' events' + (b.events.length < b.events_total ? ', first ' + b.events.length + ' shown' : '') + ')'}),
      h('div', {cls: 'trajectory'}, b.events.map(eventBlock)));
  }

  function windowOf(indexes, branch) {
    var at = branch === null ? 0 : Math.max(0, indexes.indexOf(branch));
    var start = Math.floor(at / SIDE) * SIDE;
    return indexes.slice(start, start + SIDE);
  }

  var taskCache = {};

  function viewTask(run, taskId, branch) {
    setCrumbs([['runs', '#/'], [run, runLink(run)], [taskId, branch === null ? null : taskLink(run, taskId)]].concat(branch === null ? [] : [['#' + branch, null]]));
    var token = renderToken;
    var cacheKey = run + '\u0000' + taskId;
    var known = taskCache[cacheKey];
    var first = known ? Promise.resolve(known) : api('task', {run: run, task: taskId}).then(function (d) { taskCache[cacheKey] = d.task.branch_indexes; return d.task.branch_indexes; });
    return first.then(function (indexes) {
      var shown = windowOf(indexes, branch);
      var isFirst = indexes.slice(0, SIDE).join(',') === shown.join(',');
      return api('task', {run: run, task: taskId, branches: isFirst ? null : shown.join(',')});
    }).then(function (data) {
      if (token !== renderToken) return;
      var task = data.task, indexes = task.branch_indexes;
      var shown = data.shown;
      var at = shown.length ? indexes.indexOf(shown[0]) : 0;
      var prevWin = at > 0 ? indexes[at - SIDE] : null, nextWin = at + SIDE < indexes.length ? indexes[at + SIDE] : null;
      pager = {prev: prevWin === null ? null : function () { location.hash = branchLink(run, taskId, prevWin); },
               next: nextWin === null ? null : function () { location.hash = branchLink(run, taskId, nextWin); }};
      var spec = task.spec || {};
      var header = h('section', {cls: 'taskhead'},
        h('h1', {text: 'Task ' + task.task_id}),
        pre(task.prompt, 'prompt'),
        h('div', {cls: 'muted small', text: 'verifiers: ' + (task.verifiers || []).join(', ') + ' · ' + indexes.length + ' branches · ' + task.task_hash}),
        Object.keys(spec.files || {}).length ? h('details', null, h('summary', {text: 'task files (' + Object.keys(spec.files).length + ')'}),
          Object.keys(spec.files).map(function (f) { return [h('div', {cls: 'fname', text: f}), pre(spec.files[f], 'small')]; })) : null,
        h('div', {cls: 'pager'},
          h('button', {type: 'button', disabled: prevWin === null, text: '‹ branches (p)', onclick: pager.prev}),
          h('span', {text: 'branches ' + shown.join(', ') + ' of ' + indexes.length}),
          h('button', {type: 'button', disabled: nextWin === null, text: 'branches (n) ›', onclick: pager.next})));
      var columns = h('div', {cls: 'side-by-side', id: 'side-by-side'}, data.branches.map(function (b) {
        return branchColumn(run, taskId, b, b.branch_index === branch);
      }));
      var judgments = data.judgments.length ? h('details', {cls: 'judgments'}, h('summary', {text: 'judge samples on these branches (' + data.judgments.length + ')'}),
        h('table', {cls: 'list'}, h('thead', null, h('tr', null, ['judge', 'kind', 'a', 'b', 'sample', 'swapped', 'score', 'preference', 'status'].map(function (x) { return h('th', {text: x}); }))),
          h('tbody', null, data.judgments.map(function (j) {
            return h('tr', null, [j.judge, j.kind, j.branch_a, j.branch_b === null ? '' : j.branch_b, j.sample_index, j.swapped ? 'yes' : '',
              j.score === null ? '' : j.score, j.preference || '', j.status].map(function (x) { return h('td', {text: String(x)}); }));
          })))) : null;
      var choices = bundle ? shown : indexes;
      var selA = h('select', {id: 'diff-a'}, choices.map(function (i) { return h('option', {value: i, text: '#' + i, selected: i === shown[0]}); }));
      var selB = h('select', {id: 'diff-b'}, choices.map(function (i) { return h('option', {value: i, text: '#' + i, selected: i === (shown[1] === undefined ? shown[0] : shown[1])}); }));
      var diffOut = h('div', {id: 'diff'});
      var diff = h('section', {cls: 'diffbox'}, h('h2', {text: 'Diff of final workspaces'}),
        h('form', {cls: 'filters', onsubmit: function (e) { e.preventDefault(); showDiff(); }},
          h('label', null, 'from ', selA), h('label', null, ' to ', selB), h('button', {type: 'submit', id: 'diff-go', text: 'compare'})),
        diffOut);
      function showDiff() {
        diffOut.textContent = 'loading…';
        api('diff', {run: run, task: taskId, a: selA.value, b: selB.value}).then(function (d) {
          diffOut.textContent = '';
          if (!d.files.length) { append(diffOut, h('p', {cls: 'muted', id: 'diff-same', text: 'the two final workspaces are identical'})); return; }
          append(diffOut, d.files.map(function (f) {
            return h('div', {cls: 'dfile', 'data-path': f.path}, h('div', {cls: 'fname', text: f.path + ' (' + f.change + ')'}),
              h('pre', {cls: 'diff'}, f.lines.map(function (line) {
                var c = line[0] === '+' ? 'add' : line[0] === '-' ? 'del' : line[0] === '@' ? 'hunk' : 'ctx';
                return h('span', {cls: c, text: line + '\n'});
              })));
          }), d.cut ? h('p', {cls: 'muted', text: 'diff cut at its size limit'}) : null);
        }, function (err) { diffOut.textContent = String(err.message || err); });
      }
      app.textContent = '';
      append(app, [header, columns, judgments, diff]);
      if (shown.length > 1) showDiff(); else diffOut.textContent = 'one branch only';
      if (branch !== null) {
        var col = document.getElementById('branch-' + branch);
        if (col) { col.scrollIntoView({block: 'nearest', inline: 'nearest'}); }
      }
    });
  }

  // ------------------------------------------------------------ routing and keys

  function route() {
    renderToken += 1;
    navIndex = -1;
    pager = null;
    setStatus('');
    var parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
    var done;
    if (!parts[0]) done = viewRuns();
    else if (parts[0] === 'run' && parts.length === 2) done = viewRun(parts[1]);
    else if (parts[0] === 'run' && parts[2] === 'rankings') done = viewRankings(parts[1]);
    else if (parts[0] === 'run' && parts[2] === 'outputs') done = viewOutputs(parts[1]);
    else if (parts[0] === 'run' && parts[2] === 'output' && parts[3]) done = viewOutput(parts[1], parts[3]);
    else if (parts[0] === 'run' && parts[2] === 'search') done = viewSearch(parts[1], parts.slice(3).join('/'));
    else if (parts[0] === 'run' && parts[2] === 'task' && parts[4] === 'branch') done = viewTask(parts[1], parts[3], parseInt(parts[5], 10));
    else if (parts[0] === 'run' && parts[2] === 'task') done = viewTask(parts[1], parts[3], null);
    else done = Promise.reject(new Error('no such page: ' + location.hash));
    var token = renderToken;
    done.then(function () {
      if (token !== renderToken) return; // a later page replaced this one
      if (navIndex < 0) {
        var focus = app.querySelector('.branch.focus [data-nav]');
        var all = navItems();
        if (focus) select(all.indexOf(focus));
      }
    }, function (err) {
      if (token !== renderToken) return;
      setStatus(String(err && err.message ? err.message : err), true);
      if (app.textContent === 'Loading…') app.textContent = '';
    });
  }

  function navItems() { return Array.prototype.slice.call(app.querySelectorAll('[data-nav]')); }

  function select(i) {
    var items = navItems();
    if (!items.length) return;
    navIndex = Math.max(0, Math.min(items.length - 1, i));
    items.forEach(function (el, k) { el.classList.toggle('selected', k === navIndex); });
    items[navIndex].scrollIntoView({block: 'nearest', inline: 'nearest'});
  }

  function up() {
    var parts = location.hash.replace(/^#\/?/, '').split('/');
    if (parts[0] !== 'run') return;
    if (parts.length >= 6) location.hash = '#/' + parts.slice(0, 4).join('/');
    else if (parts.length > 2) location.hash = '#/' + parts.slice(0, 2).join('/');
    else location.hash = '#/';
  }

  document.addEventListener('keydown', function (e) {
    var tag = (e.target && e.target.tagName) || '';
    if (tag === 'INPUT' || tag === 'SELECT' || tag === 'TEXTAREA') {
      if (e.key === 'Escape') e.target.blur();
      return;
    }
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    var items = navItems();
    if (e.key === 'j' || e.key === 'ArrowDown' || e.key === 'ArrowRight') { select(navIndex + 1); e.preventDefault(); }
    else if (e.key === 'k' || e.key === 'ArrowUp' || e.key === 'ArrowLeft') { select(navIndex < 0 ? 0 : navIndex - 1); e.preventDefault(); }
    else if ((e.key === 'Enter' || e.key === 'o') && navIndex >= 0 && items[navIndex]) { location.hash = items[navIndex].getAttribute('data-nav'); e.preventDefault(); }
    else if (e.key === 'u' || e.key === 'Backspace') { up(); e.preventDefault(); }
    else if (e.key === 'n' && pager && pager.next) { pager.next(); }
    else if (e.key === 'p' && pager && pager.prev) { pager.prev(); }
    else if (e.key === '/') { var s = document.getElementById('search'); if (s) { s.focus(); e.preventDefault(); } }
  });

  window.addEventListener('hashchange', route);
  document.getElementById('mode').textContent = bundle ? 'static bundle' : 'live (read-only)';
  route();
})();
