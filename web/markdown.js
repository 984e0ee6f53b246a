// A small markdown renderer and code highlighter for the chat page. Every piece of text it puts on
// the page is a range of the source, so the text of accepted drafts can be marked wherever it
// lands (NxMarkdown.text splits a range at the draft flags). Only what chat answers use:
// fenced code, headings, lists, quotes, rules, paragraphs, inline code, bold, italic, links.
'use strict';
(function () {
  // Appends src[a, b) to parent, drafted characters (drafted(i) true) wrapped in
  // <span class="dr" data-o="offset">.
  function text(parent, src, a, b, drafted) {
    let i = a;
    while (i < b) {
      const d = drafted ? drafted(i) : false;
      let j = i + 1;
      while (j < b && (drafted ? drafted(j) : false) === d) j++;
      if (d) {
        const s = document.createElement('span');
        s.className = 'dr';
        s.dataset.o = String(i);
        s.textContent = src.slice(i, j);
        parent.appendChild(s);
      } else {
        parent.appendChild(document.createTextNode(src.slice(i, j)));
      }
      i = j;
    }
  }

  function el(tag, cls) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    return e;
  }

  // ------------------------------------------------------------ code highlighting
  const KW = {
    c: 'auto break case char const continue default do double else enum extern float for goto if inline int long register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while bool true false NULL nullptr class namespace template typename public private protected virtual new delete this using',
    js: 'async await break case catch class const continue debugger default delete do else export extends finally for from function if import in instanceof let new of return static super switch this throw try typeof var void while with yield true false null undefined interface type enum implements',
    py: 'and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield True False None self',
    rust: 'as async await break const continue crate dyn else enum extern false fn for if impl in let loop match mod move mut pub ref return self Self static struct super trait true type unsafe use where while',
    go: 'break case chan const continue default defer else fallthrough for func go goto if import interface map package range return select struct switch type var true false nil',
    sh: 'if then else elif fi case esac for while until do done in function return local export echo exit set',
  };
  const ALIAS = { cpp: 'c', 'c++': 'c', h: 'c', cc: 'c', java: 'c', cs: 'c', javascript: 'js', ts: 'js', typescript: 'js',
    jsx: 'js', tsx: 'js', json: 'js', python: 'py', py3: 'py', rs: 'rust', golang: 'go', bash: 'sh', shell: 'sh', zsh: 'sh', console: 'sh' };
  const kwSets = {};
  for (const k of Object.keys(KW)) kwSets[k] = new Set(KW[k].split(' '));

  // Tokens [{cls, a, b}] of code src[a, b) in language lang (offsets into src).
  function tokens(src, a, b, lang) {
    const L = ALIAS[lang] || (KW[lang] ? lang : 'c');
    const kws = kwSets[L];
    const hashComment = L === 'py' || L === 'sh';
    const out = [];
    let i = a;
    const isId = (ch) => /[A-Za-z0-9_$]/.test(ch);
    while (i < b) {
      const ch = src[i], two = src.slice(i, i + 2);
      let j = i + 1, cls = null;
      if ((two === '//' && !hashComment) || (ch === '#' && hashComment)) {
        while (j < b && src[j] !== '\n') j++;
        cls = 'com';
      } else if (two === '/*' && !hashComment) {
        const e = src.indexOf('*/', i + 2);
        j = e < 0 || e + 2 > b ? b : e + 2;
        cls = 'com';
      } else if (ch === '"' || ch === "'" || ch === '`') {
        while (j < b && src[j] !== ch && src[j] !== '\n') j += src[j] === '\\' ? 2 : 1;
        j = Math.min(j + 1, b);
        cls = 'str';
      } else if (/[0-9]/.test(ch) && !(i > a && isId(src[i - 1]))) {
        while (j < b && /[0-9A-Fa-fxX._]/.test(src[j])) j++;
        cls = 'num';
      } else if (/[A-Za-z_$]/.test(ch)) {
        while (j < b && isId(src[j])) j++;
        const w = src.slice(i, j);
        let k = j;
        while (k < b && src[k] === ' ') k++;
        cls = kws.has(w) ? 'kw' : src[k] === '(' ? 'fn' : null;
      }
      out.push({ cls, a: i, b: j });
      i = j;
    }
    return out;
  }

  function codeBlock(parent, src, a, b, lang, drafted) {
    const pre = el('pre'), code = el('code');
    if (lang) {
      code.dataset.lang = lang;
      const tag = el('span', 'lang');
      tag.textContent = lang;
      tag.setAttribute('aria-hidden', 'true');
      pre.appendChild(tag);
    }
    for (const t of tokens(src, a, b, (lang || '').toLowerCase())) {
      if (!t.cls) { text(code, src, t.a, t.b, drafted); continue; }
      const s = el('span', 'hl-' + t.cls);
      text(s, src, t.a, t.b, drafted);
      code.appendChild(s);
    }
    pre.appendChild(code);
    parent.appendChild(pre);
  }

  // ------------------------------------------------------------ inline
  function inline(parent, src, a, b, drafted) {
    let i = a, plain = a;
    const flush = (to) => { if (to > plain) text(parent, src, plain, to, drafted); };
    while (i < b) {
      const ch = src[i];
      if (ch === '\\' && i + 1 < b && /[\\`*_\[\]()#>-]/.test(src[i + 1])) {
        flush(i); plain = i + 1; i += 2; continue;
      }
      if (ch === '`') {
        const e = src.indexOf('`', i + 1);
        if (e > i && e < b) {
          flush(i);
          const c = el('code');
          text(c, src, i + 1, e, drafted);
          parent.appendChild(c);
          i = plain = e + 1;
          continue;
        }
      }
      if ((ch === '*' || ch === '_') && src[i + 1] === ch) {
        const e = src.indexOf(ch + ch, i + 2);
        if (e > i + 2 && e < b) {
          flush(i);
          const s = el('strong');
          inline(s, src, i + 2, e, drafted);
          parent.appendChild(s);
          i = plain = e + 2;
          continue;
        }
      }
      if ((ch === '*' || ch === '_') && src[i + 1] !== ch && src[i + 1] !== ' ' && (i === a || !/\w/.test(src[i - 1]))) {
        const e = src.indexOf(ch, i + 1);
        if (e > i + 1 && e < b && src[e - 1] !== ' ') {
          flush(i);
          const s = el('em');
          inline(s, src, i + 1, e, drafted);
          parent.appendChild(s);
          i = plain = e + 1;
          continue;
        }
      }
      if (ch === '[') {
        const m = /^\[([^\]\n]*)\]\((https?:\/\/[^\s)]+)\)/.exec(src.slice(i, b));
        if (m) {
          flush(i);
          const l = el('a');
          l.href = m[2];
          l.rel = 'noopener noreferrer';
          l.target = '_blank';
          inline(l, src, i + 1, i + 1 + m[1].length, drafted);
          parent.appendChild(l);
          i = plain = i + m[0].length;
          continue;
        }
      }
      i++;
    }
    flush(b);
  }

  // ------------------------------------------------------------ blocks
  function lines(src) {
    const out = [];
    let a = 0;
    while (a <= src.length) {
      let e = src.indexOf('\n', a);
      if (e < 0) e = src.length;
      out.push({ a, b: e, s: src.slice(a, e) });
      if (e === src.length) break;
      a = e + 1;
    }
    return out;
  }

  function render(parent, src, drafted) {
    const ls = lines(src);
    let i = 0;
    let list = null, listType = null;
    const endList = () => { list = null; listType = null; };
    while (i < ls.length) {
      const l = ls[i], s = l.s;
      const fence = /^(\s*)(```+|~~~+)\s*([\w+#.-]*)/.exec(s);
      if (fence) {
        endList();
        let j = i + 1;
        while (j < ls.length && !ls[j].s.trimStart().startsWith(fence[2])) j++;
        const a = i + 1 < ls.length ? ls[i + 1].a : l.b;
        const b = j < ls.length ? (j > i + 1 ? ls[j - 1].b : a) : (ls[ls.length - 1].b);
        codeBlock(parent, src, a, Math.max(a, b), fence[3], drafted);
        i = j + 1;
        continue;
      }
      if (!s.trim()) { endList(); i++; continue; }
      const h = /^(#{1,6})\s+/.exec(s);
      if (h) {
        endList();
        const e = el('h' + Math.min(6, h[1].length + 2));
        inline(e, src, l.a + h[0].length, l.b, drafted);
        parent.appendChild(e);
        i++;
        continue;
      }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(s)) { endList(); parent.appendChild(el('hr')); i++; continue; }
      const li = /^(\s*)([-*+]|\d+[.)])\s+/.exec(s);
      if (li) {
        const type = /\d/.test(li[2]) ? 'ol' : 'ul';
        if (!list || listType !== type) { list = el(type); listType = type; parent.appendChild(list); }
        const item = el('li');
        inline(item, src, l.a + li[0].length, l.b, drafted);
        list.appendChild(item);
        i++;
        continue;
      }
      if (/^\s*>/.test(s)) {
        endList();
        const q = el('blockquote');
        while (i < ls.length && /^\s*>/.test(ls[i].s)) {
          const off = ls[i].s.indexOf('>') + 1 + (ls[i].s[ls[i].s.indexOf('>') + 1] === ' ' ? 1 : 0);
          const p = el('p');
          inline(p, src, ls[i].a + off, ls[i].b, drafted);
          q.appendChild(p);
          i++;
        }
        parent.appendChild(q);
        continue;
      }
      endList();
      const p = el('p');
      let first = true;
      while (i < ls.length && ls[i].s.trim() && !/^(\s*)(```|~~~|#{1,6}\s|>|([-*+]|\d+[.)])\s)/.test(ls[i].s)) {
        if (!first) p.appendChild(el('br'));
        inline(p, src, ls[i].a, ls[i].b, drafted);
        first = false;
        i++;
      }
      if (first) { inline(p, src, l.a, l.b, drafted); i++; } // a line no block claims
      parent.appendChild(p);
    }
  }

  window.NxMarkdown = { render, text, tokens };
})();
