"""The page's style and its one script, inlined: the page needs no network. The script only
sorts, filters and copies; every table and figure reads without it."""

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1400px;padding:0 16px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0;font-size:12px}caption{text-align:left;color:#555;padding:.3em 0}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:right;vertical-align:top}
th{background:#f3f3f3}table.kv th{text-align:left}table.kv td{text-align:left;max-width:900px;word-break:break-word;white-space:pre-line}
summary h2{display:inline-block}
th button{font:inherit;font-weight:bold;background:none;border:0;cursor:pointer;padding:0}
th[aria-sort=ascending] button::after{content:" \\25B2"}th[aria-sort=descending] button::after{content:" \\25BC"}
td.verdict{text-align:left;font-weight:600}td.flags{text-align:left;white-space:nowrap}td.flags details{display:inline-block;margin-left:4px}button.copy:disabled{cursor:not-allowed}td{max-width:260px}td.flags code{display:block;max-width:520px;min-width:360px;
white-space:pre-wrap;word-break:break-all;font-size:11px}
pre{background:#f6f6f6;padding:8px;white-space:pre-wrap;word-break:break-all;font-size:11px}
.scroll{max-height:70vh;overflow:auto;border:1px solid #ddd}.scroll thead th{position:sticky;top:0}
figure{margin:1em 0}figcaption{color:#555;font-size:12px}svg.figure{max-width:100%;height:auto}
.controls{margin:.5em 0}.controls label{margin-right:1em}.note{color:#555}
.legend span{display:inline-block;padding:0 6px;margin-right:4px;border:1px solid #bbb}
dl.legend{display:grid;grid-template-columns:max-content 1fr;gap:2px 8px;margin:.3em 0 .8em;font-size:13px}
dl.legend dt{font-weight:600}dl.legend dd{margin:0}#verdict-meanings summary{color:#555;cursor:pointer}
"""

JS = """
(function () {
  var table = document.getElementById('rows');
  var status = document.getElementById('status');
  function say(text) { if (status) { status.textContent = text; } }
  function value(cell) { var v = cell.getAttribute('data-v'); return v === null ? (cell.textContent === '-' ? '' : cell.textContent) : v; }
  if (table) {
    var body = table.tBodies[0];
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, column) {
      var button = th.querySelector('button');
      if (!button) { return; }
      button.addEventListener('click', function () {
        var ascending = th.getAttribute('aria-sort') !== 'ascending';
        Array.prototype.forEach.call(heads, function (other) {
          if (other.hasAttribute('aria-sort')) { other.setAttribute('aria-sort', 'none'); }
        });
        th.setAttribute('aria-sort', ascending ? 'ascending' : 'descending');
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = value(a.cells[column]), y = value(b.cells[column]);
          var nx = x === '' ? NaN : Number(x), ny = y === '' ? NaN : Number(y);
          var order;
          if (!isNaN(nx) && !isNaN(ny)) { order = nx - ny; }
          else if (isNaN(nx) !== isNaN(ny)) { return isNaN(nx) ? 1 : -1; }  // blanks last
          else { order = x.localeCompare(y); }
          return ascending ? order : -order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
        say('sorted by ' + button.textContent + (ascending ? ', ascending' : ', descending'));
      });
    });
    var text = document.getElementById('filter-text'), verdict = document.getElementById('filter-verdict');
    var verdictColumn = Array.prototype.findIndex.call(heads, function (th) { return th.dataset.key === 'verdict'; });
    function filter() {
      var words = text.value.toLowerCase().split(/\\s+/).filter(Boolean), wanted = verdict.value, shown = 0;
      Array.prototype.forEach.call(body.rows, function (row) {
        var content = row.textContent.toLowerCase();
        var ok = words.every(function (w) { return content.indexOf(w) >= 0; });
        if (ok && wanted && verdictColumn >= 0) { ok = value(row.cells[verdictColumn]) === wanted; }
        row.hidden = !ok;
        if (ok) { shown += 1; }
      });
      say(shown + ' of ' + body.rows.length + ' rows shown');
    }
    if (text) { text.addEventListener('input', filter); }
    if (verdict) { verdict.addEventListener('change', filter); }
  }
  var template = document.getElementById('launch-template');
  // Each row's flags: runs of indices (base 36) into the groups every row draws from (table.flag_codes).
  var flagData = document.getElementById('row-flags');
  flagData = flagData ? JSON.parse(flagData.textContent) : {groups: [], common: []};
  var shared = {};
  flagData.common.forEach(function (i) { shared[i] = true; });
  function rowGroups(cell) {
    var out = [];
    cell.dataset.f.split(' ').forEach(function (run) {
      var ends = run.split('-'), a = parseInt(ends[0], 36), b = parseInt(ends[ends.length - 1], 36);
      for (var i = a; i <= b; i++) { out.push(i); }
    });
    return out;
  }
  function rowArgs(cell) {  // the row's whole megatron_args, in its order
    return [].concat.apply([], rowGroups(cell).map(function (i) { return flagData.groups[i]; }));
  }
  window.rowArgs = rowArgs;
  // a word as a shell reads it back (Python's shlex.quote): DeepSeek-V3's --moe-layer-freq
  // ([0]*3+[1]*58), pasted unquoted, was a bash syntax error
  function shellWord(word) {
    return /^[A-Za-z0-9_@%+=:,.\\/-]+$/.test(word) ? word : "'" + word.replace(/'/g, "'\\"'\\"'") + "'";
  }
  function shellLine(words) { return words.map(shellWord).join(' '); }
  window.shellLine = shellLine;
  var cellTemplate = document.createElement('template');
  cellTemplate.innerHTML = '<button type="button" class="copy" data-copy="flags">copy flags</button> '
    + '<button type="button" class="copy" data-copy="launch">copy launch</button>'
    + '<details><summary>flags</summary><code></code></details>';
  Array.prototype.forEach.call(document.querySelectorAll('#rows td.flags'), function (cell) {
    var parts = cellTemplate.content.cloneNode(true), launch = parts.querySelector('[data-copy=launch]');
    if (cell.dataset.no) { launch.disabled = true; launch.title = cell.dataset.no; }
    parts.querySelector('code').textContent = rowGroups(cell).filter(function (i) { return !shared[i]; })
      .map(function (i) { return shellLine(flagData.groups[i]); }).join(' ');
    cell.appendChild(parts);
  });
  function copy(textToCopy) {
    function fallback() {
      var area = document.createElement('textarea');
      area.value = textToCopy; document.body.appendChild(area); area.select();
      try { document.execCommand('copy'); say('copied'); } catch (e) { say('select and copy by hand'); }
      document.body.removeChild(area);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(textToCopy).then(function () { say('copied'); }, fallback);
    } else { fallback(); }
  }
  document.addEventListener('click', function (event) {
    var button = event.target.closest ? event.target.closest('button.copy') : null;
    if (!button) { return; }
    var flags, row = button.closest('tr');
    if (row) { flags = shellLine(rowArgs(row.querySelector('td.flags'))); }
    else { flags = document.getElementById(button.dataset.target).textContent.trim(); }
    if (button.dataset.copy === 'launch' && template && row) {
      var nodes = row.dataset.nodes || table.dataset.nodes, ppn = table.dataset.ppn;
      copy(template.textContent.replace('NODES', nodes).replace('PPN', ppn).replace('FLAGS', flags));
    } else { copy(flags); }
    document.body.dataset.copied = flags.length;
  });
})();
"""
